//! What SES reports through SNS: its bounce and complaint notifications (and the same
//! records from SES event publishing) read into [`Event`]s, with the outbox row they name.

use serde_json::Value;

use crate::feedback::{Event, EventKind, FeedbackError, RowNames, address, parse_id};
use crate::suppression::BounceType;

/// The recipients an SES notification (or event) reports, with the row it names.
pub(super) fn ses_events(message: &str) -> Result<Vec<Event>, FeedbackError> {
    let ses: Value = serde_json::from_str(message)
        .map_err(|e| FeedbackError::Invalid(format!("the SNS Message is not SES JSON: {e}")))?;
    let kind = ses
        .get("notificationType")
        .or_else(|| ses.get("eventType"))
        .and_then(Value::as_str)
        .ok_or_else(|| FeedbackError::Invalid("no notificationType or eventType".to_owned()))?;
    let row = row_of(&ses["mail"]);
    let (kind, list, address_field) = match kind {
        "Bounce" => {
            let bounce_type = match ses["bounce"]["bounceType"].as_str() {
                Some("Permanent") => BounceType::Hard,
                Some("Transient") => BounceType::Soft,
                _ => BounceType::Undetermined,
            };
            (
                EventKind::Bounce(bounce_type),
                &ses["bounce"]["bouncedRecipients"],
                "emailAddress",
            )
        }
        "Complaint" => (
            EventKind::Complaint,
            &ses["complaint"]["complainedRecipients"],
            "emailAddress",
        ),
        // Deliveries, sends, opens...: nothing to record.
        _ => return Ok(Vec::new()),
    };
    let recipients = list
        .as_array()
        .ok_or_else(|| FeedbackError::Invalid("no recipients in the notification".to_owned()))?;
    recipients
        .iter()
        .map(|recipient| {
            let text = recipient[address_field].as_str().ok_or_else(|| {
                FeedbackError::Invalid("a recipient without an address".to_owned())
            })?;
            let detail = recipient["diagnosticCode"]
                .as_str()
                .or_else(|| ses["complaint"]["complaintFeedbackType"].as_str())
                .map(|d| crate::text::cut(d, crate::suppression::MAX_DETAIL_CHARS).to_owned());
            Ok(Event {
                kind: kind.clone(),
                address: address(text)?,
                row: row.clone(),
                detail,
            })
        })
        .collect()
}

/// The outbox row of the `mail` object: its original headers, when SES was told to
/// include them, or its common headers' Message-ID.
fn row_of(mail: &Value) -> RowNames {
    let header = |wanted: &str| {
        mail["headers"].as_array()?.iter().find_map(|h| {
            h["name"]
                .as_str()
                .filter(|name| name.eq_ignore_ascii_case(wanted))
                .and(h["value"].as_str())
        })
    };
    RowNames {
        message_id: header("Message-ID")
            .or_else(|| mail["commonHeaders"]["messageId"].as_str())
            .map(str::to_owned),
        outbox_id: header("X-Outbox-Id").and_then(parse_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permanent_bounce_names_its_recipients_and_row() {
        let message = r#"{"notificationType":"Bounce",
            "bounce":{"bounceType":"Permanent","bouncedRecipients":[
                {"emailAddress":"Gone@Example.com","diagnosticCode":"smtp; 550 5.1.1 user unknown"}]},
            "mail":{"commonHeaders":{"messageId":"<outbox-12@mail.example>"}}}"#;
        let events = ses_events(message).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind, EventKind::Bounce(BounceType::Hard));
        assert_eq!(events[0].address, "gone@example.com");
        assert_eq!(
            events[0].row.message_id.as_deref(),
            Some("<outbox-12@mail.example>")
        );
        assert!(
            ses_events(r#"{"notificationType":"Delivery"}"#)
                .unwrap()
                .is_empty()
        );
        assert!(ses_events("[]").is_err());
    }
}
