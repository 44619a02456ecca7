use super::{InvalidSchema, Schema};

#[test]
fn names_outside_a_plain_lower_case_identifier_are_refused() {
    for (name, error) in [
        ("", InvalidSchema::Characters(String::new())),
        ("Mail", InvalidSchema::Characters("Mail".into())),
        ("1mail", InvalidSchema::Characters("1mail".into())),
        ("mail; drop", InvalidSchema::Characters("mail; drop".into())),
        ("ma\"il", InvalidSchema::Characters("ma\"il".into())),
        ("pg_mail", InvalidSchema::Reserved("pg_mail".into())),
        (&"m".repeat(64), InvalidSchema::TooLong("m".repeat(64))),
    ] {
        assert_eq!(name.parse::<Schema>(), Err(error), "{name:?}");
    }
    for name in ["mail", "_outboxd", "outboxd_2", &"m".repeat(63)] {
        assert!(name.parse::<Schema>().is_ok(), "{name:?}");
    }
}
