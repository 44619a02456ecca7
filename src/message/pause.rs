//! An operator's pause of one kind: which kind, and why. A paused kind's messages stay
//! pending and unclaimed on every replica until it is resumed; nothing is lost.

use serde::Deserialize;

use super::validate_kind;

/// The longest reason kept with a pause.
pub const MAX_PAUSE_REASON_CHARS: usize = 500;

/// A pause as an operator asks for it, before it is checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    pub reason: String,
}

/// A pause checked: a kind name outboxd could have templates for, and a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPause {
    pub kind: String,
    pub reason: String,
}

impl NewPause {
    /// Checks `kind` as a message's kind is checked, and `reason`: 1 to
    /// [`MAX_PAUSE_REASON_CHARS`] characters once trimmed, no control character.
    pub fn new(kind: &str, reason: &str) -> Result<Self, String> {
        validate_kind(kind).map_err(|e| e.to_string())?;
        let reason = reason.trim();
        if reason.is_empty() {
            return Err("a pause needs a reason: say why, for whoever resumes it".to_owned());
        }
        if reason.chars().count() > MAX_PAUSE_REASON_CHARS {
            return Err(format!(
                "the reason must be at most {MAX_PAUSE_REASON_CHARS} characters"
            ));
        }
        if reason.chars().any(char::is_control) {
            return Err("the reason must not hold control characters".to_owned());
        }
        Ok(Self {
            kind: kind.to_owned(),
            reason: reason.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_needs_a_valid_kind_and_a_reason() {
        let pause = NewPause::new("newsletter", "  template ships broken  ").expect("valid");
        assert_eq!(pause.reason, "template ships broken");
        for (kind, reason) in [
            ("News", "why"),
            ("../x", "why"),
            ("newsletter", "   "),
            ("newsletter", "line\nbreak"),
            ("newsletter", &"x".repeat(MAX_PAUSE_REASON_CHARS + 1)),
        ] {
            assert!(NewPause::new(kind, reason).is_err(), "{kind:?} {reason:?}");
        }
    }
}
