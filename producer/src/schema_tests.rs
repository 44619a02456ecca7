use super::{InvalidSchema, OBJECTS, Schema, qualify};

fn mail() -> Schema {
    "mail".parse().expect("a valid schema name")
}

#[test]
fn every_object_written_bare_is_put_in_the_schema() {
    for object in OBJECTS {
        assert_eq!(
            qualify(&format!("SELECT * FROM {object} WHERE true"), &mail()),
            format!("SELECT * FROM \"mail\".{object} WHERE true")
        );
    }
}

#[test]
fn a_column_qualified_by_its_table_keeps_the_column() {
    assert_eq!(
        qualify(
            "UPDATE outbox_suppressions SET x = 1 WHERE outbox_suppressions.suppressed_until IS NULL",
            &mail()
        ),
        "UPDATE \"mail\".outbox_suppressions SET x = 1 WHERE \"mail\".outbox_suppressions.suppressed_until IS NULL"
    );
}

#[test]
fn functions_are_called_in_the_schema() {
    assert_eq!(
        qualify(
            "SET created_at = outbox_on_the_calendar(created_at)",
            &mail()
        ),
        "SET created_at = \"mail\".outbox_on_the_calendar(created_at)"
    );
}

#[test]
fn literals_comments_quoted_names_and_bodies_are_left_alone() {
    for untouched in [
        "SELECT pg_notify('outbox_messages', '')",
        "SELECT 'it''s outbox_messages'",
        "SELECT 1 AS \"outbox_messages\"",
        "SELECT 1 -- from outbox_messages\n",
        "SELECT 1 /* outbox_messages */",
        "DO $body$ outbox_messages $body$",
        "DO $$ outbox_messages $$",
        "SELECT m.outbox_messages FROM t m",
        "SELECT outbox_messages_pending_idx, xoutbox_messages, outbox_messages2",
    ] {
        assert_eq!(qualify(untouched, &mail()), untouched);
    }
}

#[test]
fn parameters_are_not_mistaken_for_dollar_quotes() {
    assert_eq!(
        qualify("SELECT $1 FROM outbox_messages WHERE id = $2", &mail()),
        "SELECT $1 FROM \"mail\".outbox_messages WHERE id = $2"
    );
}

#[test]
fn a_name_given_to_to_regclass_is_looked_up_in_the_schema() {
    assert_eq!(
        qualify(
            "SELECT to_regclass('outbox_messages'), to_regclass('_sqlx_migrations')",
            &mail()
        ),
        "SELECT to_regclass('\"mail\".outbox_messages'), to_regclass('_sqlx_migrations')"
    );
}

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
