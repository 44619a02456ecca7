//! The DSN reader against notifications as their servers send them: Postfix's (captured from
//! the Postfix the integration tests run), RFC 3464's own example, one shaped as Gmail's with
//! its documented 550 5.1.1 reply, a Postfix delay warning, and an auto-reply that quotes DSN
//! words in its text.

use super::{NotADsn, read};

fn sample(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/support/dsn/{name}.eml", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn postfix_s_unknown_user_is_a_hard_bounce_of_its_final_recipient() {
    let statuses = read(&sample("postfix_unknown_user")).unwrap();
    assert_eq!(statuses.len(), 1);
    let status = &statuses[0];
    assert_eq!(status.recipient, "nobody@dead.test");
    assert_eq!((status.action.as_str(), status.status.as_str()), ("failed", "5.1.1"));
    assert_eq!(status.diagnostic.as_deref(), Some("unknown user"));
    assert!(status.is_hard() && !status.is_soft() && status.says_mailbox_unknown());
}

/// A DSN shaped as Postfix writes one, its recipient block given.
fn postfix_reporting(block: &str) -> Vec<u8> {
    let sample = String::from_utf8(sample("postfix_unknown_user")).unwrap();
    let start = sample.find("Final-Recipient:").unwrap();
    let end = sample[start..].find("\n\n").unwrap() + start;
    format!("{}{block}{}", &sample[..start], &sample[end..]).into_bytes()
}

#[test]
fn a_failure_for_good_about_the_sender_or_the_content_does_not_say_the_mailbox_is_gone() {
    // Microsoft's, Gmail's and a blocklist's refusals of the sender, and a size refusal,
    // as a relay that gave up reports them: failed for good, but the mailbox is fine.
    for (status, said) in [
        ("5.7.708", "smtp; 550 5.7.708 Service unavailable. Access denied, traffic not accepted from this IP."),
        ("5.7.26", "smtp; 550-5.7.26 Unauthenticated email from acme.example is not accepted due to domain's DMARC policy."),
        ("5.7.1", "smtp; 554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org"),
        ("5.3.4", "smtp; 552 5.3.4 Message size exceeds fixed limit"),
        ("5.4.316", "smtp; 550 5.4.316 Message expired, connection refused"),
    ] {
        let block = format!("Final-Recipient: rfc822; ada@customer.example\nAction: failed\nStatus: {status}\nDiagnostic-Code: {said}");
        let statuses = read(&postfix_reporting(&block)).unwrap();
        assert!(statuses[0].is_hard(), "{status}");
        assert!(!statuses[0].says_mailbox_unknown(), "{status}");
    }
    let gone = "Final-Recipient: rfc822; ada@customer.example\nAction: failed\nStatus: 5.1.10\nDiagnostic-Code: smtp; 550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup";
    assert!(read(&postfix_reporting(gone)).unwrap()[0].says_mailbox_unknown());
}

#[test]
fn a_forwarded_address_is_named_as_the_message_named_it_and_an_action_s_comment_is_dropped() {
    let block = "Original-Recipient: rfc822;bob@alumni.example\nFinal-Recipient: rfc822; bob.old@gmail.com\nAction: failed (bad destination mailbox address)\nStatus: 5.1.1";
    let statuses = read(&postfix_reporting(block)).unwrap();
    assert_eq!(statuses[0].recipient, "bob@alumni.example");
    assert_eq!(statuses[0].action, "failed");
}

#[test]
fn gmail_s_no_such_user_is_a_hard_bounce_with_its_folded_diagnostic_whole() {
    let statuses = read(&sample("gmail_no_such_account")).unwrap();
    let status = &statuses[0];
    assert_eq!(status.recipient, "someone.who.left@gmail.com");
    assert!(status.is_hard());
    let said = status.diagnostic.as_deref().unwrap();
    assert!(said.starts_with("550-5.1.1 The email account that you tried to reach does not exist."), "{said}");
    assert!(said.ends_with("?p=NoSuchUser"), "{said}");
}

#[test]
fn a_failure_with_a_4xx_status_or_a_delay_is_no_hard_bounce() {
    let gave_up = read(&sample("rfc3464_gave_up_after_five_days")).unwrap();
    assert_eq!(gave_up[0].recipient, "louisl@larry.slip.umd.edu");
    assert_eq!(gave_up[0].status, "4.0.0");
    assert!(!gave_up[0].is_hard() && gave_up[0].is_soft());
    let delayed = read(&sample("postfix_delayed")).unwrap();
    assert_eq!(delayed[0].action, "delayed");
    assert!(!delayed[0].is_hard() && delayed[0].is_soft());
}

#[test]
fn an_auto_reply_is_not_a_dsn_whatever_its_text_says() {
    assert_eq!(read(&sample("vacation_auto_reply")), Err(NotADsn::NotAReport));
}

#[test]
fn a_report_of_another_type_or_without_recipients_is_refused() {
    let feedback = b"Content-Type: multipart/report; report-type=feedback-report; boundary=b\r\n\r\n--b\r\nContent-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\n--b--\r\n";
    assert_eq!(read(feedback), Err(NotADsn::NotAReport));
    let empty = b"Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; x.example\r\n\r\n--b--\r\n";
    assert_eq!(read(empty), Err(NotADsn::NoRecipient));
    let bad_status = b"Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; x.example\r\n\r\nFinal-Recipient: rfc822; a@b.example\r\nAction: failed\r\nStatus: five\r\n--b--\r\n";
    assert_eq!(read(bad_status), Err(NotADsn::NoRecipient));
    assert_eq!(read(b"\xff\xfe not even text"), Err(NotADsn::NotAReport));
}

#[test]
fn a_delivery_status_part_in_base64_is_read() {
    use base64::Engine as _;
    let report = "Reporting-MTA: dns; x.example\r\n\r\nFinal-Recipient: rfc822; gone@b.example\r\nAction: failed\r\nStatus: 5.1.1\r\n";
    let encoded = base64::engine::general_purpose::STANDARD.encode(report);
    let raw = format!("Content-Type: multipart/report; report-type=\"Delivery-Status\"; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\nContent-Transfer-Encoding: base64\r\n\r\n{encoded}\r\n--b--\r\n");
    let statuses = read(raw.as_bytes()).unwrap();
    assert_eq!(statuses[0].recipient, "gone@b.example");
    assert!(statuses[0].is_hard());
}
