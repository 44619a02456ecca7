//! The renderer's unit tests.

use super::*;
use serde_json::json;

fn renderer() -> Renderer {
    renderer_from(None)
}

/// The built-in kinds, and those of `templates` when given.
fn renderer_from(templates: Option<&std::path::Path>) -> Renderer {
    Renderer::new(
        templates,
        "Outbox <outbox@example.com>".parse().unwrap(),
        crate::message::MessageIds::new(
            crate::message::InstallationTag::parse("k3f9q2").unwrap(),
            "example.com".into(),
        ),
    )
    .unwrap()
}

fn formatted(message: &Message) -> String {
    String::from_utf8(message.formatted()).unwrap()
}

/// Why the built-in `kind` does not render `payload`.
fn refusal(kind: &str, payload: &serde_json::Value) -> RenderError {
    renderer().render(1, kind, payload).unwrap_err()
}

/// Ada's account verification email, as row `id`.
fn verification_of_ada(id: i64) -> String {
    let payload = json!({"to": "ada@example.com", "name": "Ada", "verify_url": "https://x/v"});
    formatted(
        &renderer()
            .render(id, "account_verification", &payload)
            .unwrap(),
    )
}

#[test]
fn builtin_kinds_are_the_three_the_first_application_sends() {
    let kinds: Vec<_> = renderer().kinds().map(str::to_owned).collect();
    assert_eq!(
        kinds,
        ["account_verification", "invoice_notice", "workspace_invite"]
    );
}

#[test]
fn headers_carry_the_row_id_and_a_deterministic_message_id() {
    let one = verification_of_ada(42);
    assert!(one.contains("X-Outbox-Id: 42\r\n"), "{one}");
    assert!(
        one.contains("Message-ID: <outbox-42.k3f9q2@example.com>\r\n"),
        "{one}"
    );
}

#[test]
fn a_line_break_in_a_subject_value_or_an_address_is_refused() {
    let subject = json!({"to": "a@example.com", "inviter_name": "Eve\r\nBcc: x@evil.test",
        "workspace_name": "W", "accept_url": "u"});
    let address = json!({"to": ["a@example.com", "b@example.com\nBcc: x@evil.test"],
        "name": "A", "verify_url": "u"});
    for (kind, payload, header) in [
        ("workspace_invite", subject, "subject"),
        ("account_verification", address, "to"),
    ] {
        assert_eq!(
            refusal(kind, &payload),
            RenderError::HeaderInjection(header)
        );
    }
}

#[test]
fn a_missing_variable_does_not_render() {
    let payload = json!({"to": "a@example.com", "name": "A"});
    let err = refusal("account_verification", &payload);
    assert!(
        matches!(err, RenderError::Template(ref m) if m.contains("undefined")),
        "{err}"
    );
}

#[test]
fn html_values_are_escaped_and_text_values_are_not() {
    let payload = json!({"to": "a@example.com", "name": "<b>Ada</b>", "verify_url": "u"});
    let payload = minijinja::Value::from(Serde(&payload));
    let renderer = renderer();
    let body = |file: &str| renderer.render_template(file, &payload).unwrap();
    let html = body("account_verification/body.html");
    assert!(html.contains("&lt;b&gt;Ada&lt;&#x2f;b&gt;"), "{html}");
    let text = body("account_verification/body.txt");
    assert!(text.contains("Hello <b>Ada</b>,"), "{text}");
}

#[test]
fn a_thousand_recipients_fold_into_short_header_lines_and_a_deduplicated_envelope() {
    let cc: Vec<String> = (0..997)
        .map(|i| format!("User {i} <user{i}@example.com>"))
        .collect();
    let mut payload = json!({"to": "ada@example.com", "name": "Ada", "verify_url": "https://v"});
    payload["cc"] = json!(cc);
    payload["bcc"] = json!(["ADA@example.com", "ada@EXAMPLE.com"]);
    let message = renderer()
        .render(1, "account_verification", &payload)
        .unwrap();
    let text = formatted(&message);
    assert!(text.lines().all(|l| l.len() <= 78), "a line over 78 octets");
    assert!(text.contains("user996@example.com"));
    assert!(!text.contains("ADA@example.com"), "Bcc is not a header");
    // ada@example.com and ada@EXAMPLE.com are one mailbox; ADA@ is another.
    assert_eq!(message.envelope().to().len(), 999);
}

#[test]
fn more_recipients_than_the_limit_are_refused() {
    let to: Vec<String> = (0..11).map(|i| format!("u{i}@example.com")).collect();
    let payload = json!({"to": to, "name": "Ada", "verify_url": "https://v"});
    let refused = renderer()
        .with_limits(RenderLimits {
            max_recipients: 10,
            ..RenderLimits::default()
        })
        .render(1, "account_verification", &payload)
        .unwrap_err();
    assert_eq!(refused.error_class(), "too_many_recipients");
}

#[test]
fn an_email_past_the_size_limit_is_refused_after_rendering() {
    let message = ClaimedMessage::for_tests(
        "account_verification",
        r#"{"to": "ada@example.com", "name": "Ada", "verify_url": "https://v"}"#,
    );
    let small = RenderLimits {
        max_message_bytes: 1024,
        ..RenderLimits::default()
    };
    let refused = renderer()
        .with_limits(small)
        .render_claimed(&message)
        .unwrap_err();
    assert_eq!(refused.error_class(), "too_large");
    let email = renderer().render_claimed(&message).unwrap();
    assert!(email.bytes.len() > 1024);
    assert_eq!(email.envelope.to().len(), 1);
}

#[test]
fn control_characters_are_refused_in_subjects_and_addresses() {
    let subject = json!({"to": "ada@example.com", "inviter_name": "Ada\u{b}Bold",
                         "workspace_name": "Engines", "accept_url": "https://a"});
    let refused = refusal("workspace_invite", &subject);
    assert_eq!(refused, RenderError::HeaderInjection("subject"));
    let address =
        json!({"to": "Ada\u{0} <ada@example.com>", "name": "Ada", "verify_url": "https://v"});
    let refused = refusal("account_verification", &address);
    assert_eq!(refused, RenderError::HeaderInjection("to"));
    let long = json!({"to": "ada@example.com", "inviter_name": "a ".repeat(300),
                      "workspace_name": "Engines", "accept_url": "https://a"});
    let refused = refusal("workspace_invite", &long);
    assert!(refused.to_string().contains("at most 500"), "{refused}");
}

/// A renderer with one kind of the test's own, `k`, whose files are given.
fn renderer_with(files: &[(&str, &str)]) -> Renderer {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("k")).unwrap();
    for (name, source) in [("subject.txt", "Hi"), ("body.txt", "Body")]
        .iter()
        .chain(files)
    {
        std::fs::write(dir.path().join("k").join(name), source).unwrap();
    }
    renderer_from(Some(dir.path()))
}

fn reason(error: &RenderError) -> String {
    error.to_string()
}

#[test]
fn a_declared_header_may_not_render_past_the_line_limit() {
    let renderer = renderer_with(&[("headers.txt", "X-Campaign: {{ tag }}")]);
    let fits = json!({"to": "a@example.com", "tag": "x".repeat(980)});
    assert!(renderer.render(1, "k", &fits).is_ok());
    let long = json!({"to": "a@example.com", "tag": "x".repeat(1500)});
    let error = renderer.render(1, "k", &long).unwrap_err();
    assert!(reason(&error).contains("998 octets"), "{error}");
}

#[test]
fn a_payload_value_cannot_add_a_uri_to_list_unsubscribe() {
    let renderer = renderer_with(&[("headers.txt", "List-Unsubscribe: <{{ unsubscribe_url }}>")]);
    let honest = json!({"to": "a@example.com", "unsubscribe_url": "https://x.example/u?t=1"});
    let sent = formatted(&renderer.render(1, "k", &honest).unwrap());
    assert!(
        sent.contains("List-Unsubscribe: <https://x.example/u?t=1>"),
        "{sent}"
    );
    let added = json!({"to": "a@example.com",
        "unsubscribe_url": "https://x.example/u>, <https://elsewhere.test/track"});
    let error = renderer.render(1, "k", &added).unwrap_err();
    assert!(reason(&error).contains("more URIs"), "{error}");
}

#[test]
fn attachment_names_may_not_reorder_text_and_types_take_no_parameters() {
    let renderer = renderer();
    let with = |filename: &str, content_type: &str| {
        json!({"to": "a@example.com", "name": "A", "verify_url": "u",
               "attachments": [{"filename": filename, "content_type": content_type,
                                "content_base64": "aGVsbG8="}]})
    };
    assert!(
        renderer
            .render(1, "account_verification", &with("a.txt", "text/plain"))
            .is_ok()
    );
    for (filename, content_type) in [
        ("invoice\u{202E}fdp.exe", "application/pdf"),
        ("a\u{2066}b.pdf", "application/pdf"),
        ("a.txt", "text/plain; charset=utf-7"),
        ("a.txt", "text/plain; name=\"other.exe\""),
        ("a.txt", "text"),
    ] {
        let payload = with(filename, content_type);
        assert!(
            renderer
                .render(1, "account_verification", &payload)
                .is_err(),
            "{filename:?} {content_type:?} accepted"
        );
    }
}

#[test]
fn a_template_that_loops_on_a_payload_value_stops() {
    let renderer = renderer_with(&[(
        "body.txt",
        "{% for i in range(n) %}{% for j in range(n) %}.{% endfor %}{% endfor %}",
    )]);
    let small = json!({"to": "a@example.com", "n": 10});
    assert!(renderer.render(1, "k", &small).is_ok());
    let huge = json!({"to": "a@example.com", "n": 100000});
    let error = renderer.render(1, "k", &huge).unwrap_err();
    assert!(reason(&error).contains("fuel"), "{error}");
    assert_eq!(error.error_class(), "render");
}

#[test]
fn postmark_is_told_the_row_of_each_email() {
    let sent = verification_of_ada(7);
    assert!(sent.contains("X-PM-Metadata-outbox_id: 7\r\n"), "{sent}");
}
