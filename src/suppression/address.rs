//! An address in the list's normal form ([`Address`]): parsed once from what a person, a
//! provider or a server gave, and carried as such.

use std::borrow::Borrow;

/// The longest address the list accepts (RFC 5321: 64 + 1 + 255).
pub const MAX_ADDRESS_CHARS: usize = 320;

/// An address as the list keeps it, the one normal form every path uses (the SMTP replies,
/// the webhooks, the API, the page and the CLI): the local part with ASCII letters
/// lower-cased and nothing else changed, the domain in IDNA's ASCII form (`bücher.de` and
/// `xn--bcher-kva.de` are one domain; providers report the latter). Unicode case folding
/// of the local part would map two mailboxes onto one: KELVIN SIGN (U+212A) lower-cases to
/// `k`, so a bounce for `\u{212A}ate@` suppressed `kate@`. The claim statement folds the
/// same way (the `address_key` fragment, ASCII only).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct Address(String);

impl Address {
    /// `text` (an addr-spec, or `Name <addr-spec>`) in the normal form; refused unless it
    /// parses as an email address.
    pub fn parse(text: &str) -> Result<Self, String> {
        let spec = addr_spec(text);
        if spec.chars().any(char::is_control) {
            return Err("an address may not contain control characters".to_owned());
        }
        if spec.chars().count() > MAX_ADDRESS_CHARS {
            return Err(format!(
                "an address is at most {MAX_ADDRESS_CHARS} characters"
            ));
        }
        let address = spec
            .parse::<lettre::Address>()
            .map_err(|e| format!("{spec:?} is not an email address: {e}"))?;
        Ok(Self::of(&address))
    }

    /// A parsed address in the normal form.
    pub fn of(address: &lettre::Address) -> Self {
        let domain = address.domain();
        let domain =
            idna::domain_to_ascii(domain).unwrap_or_else(|_| domain.to_ascii_lowercase());
        Self(format!("{}@{domain}", address.user().to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Address {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A set of addresses is looked up by the list's text.
impl Borrow<str> for Address {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Address {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<Address> for String {
    fn from(address: Address) -> Self {
        address.0
    }
}

/// The addr-spec of `text`: the part between `<` and a final `>`, else all of it, trimmed.
fn addr_spec(text: &str) -> &str {
    let text = text.trim();
    match (text.rfind('<'), text.strip_suffix('>')) {
        (Some(open), Some(_)) => text[open + 1..text.len() - 1].trim(),
        _ => text,
    }
}

/// The forms an address a recipient lookup is given may be stored in: the list's normal
/// form ([`Address`]), and its addr-spec with ASCII letters lower-cased, which is how
/// the lookup's index reads a payload (`outbox_recipient_keys`; it cannot turn a domain
/// into its IDNA form), so that `Ann@Bücher.de` finds what was sent to `ann@bücher.de`
/// and to `ann@xn--bcher-kva.de`. Refused unless it parses as an email address.
pub fn lookup_forms(text: &str) -> Result<Vec<String>, String> {
    let key = String::from(Address::parse(text)?);
    let folded = addr_spec(text).to_ascii_lowercase();
    Ok(if folded == key {
        vec![key]
    } else {
        vec![key, folded]
    })
}

#[cfg(test)]
mod tests {
    use super::Address;

    fn normalize_address(text: &str) -> Result<String, String> {
        Address::parse(text).map(String::from)
    }

    #[test]
    fn addresses_are_reduced_to_their_spec_and_lower_cased() {
        assert_eq!(
            normalize_address(" Ada Lovelace <Ada@Example.COM> ").unwrap(),
            "ada@example.com"
        );
        assert_eq!(normalize_address("BOB@x.org").unwrap(), "bob@x.org");
        for bad in ["", "not an address", "a@b\r\nBcc: x@y", "<>"] {
            assert!(normalize_address(bad).is_err(), "{bad:?} accepted");
        }
        assert!(normalize_address(&format!("{}@x.org", "a".repeat(400))).is_err());
        assert_eq!(
            normalize_address("Ana@Bücher.de").unwrap(),
            normalize_address("ana@xn--bcher-kva.de").unwrap()
        );
    }

    #[test]
    fn no_two_mailboxes_share_a_normal_form() {
        // KELVIN SIGN, LATIN CAPITAL I WITH DOT, and the long s fold to ASCII letters under
        // Unicode's lower-casing; each is a mailbox of its own.
        for (unicode, ascii) in [
            ("\u{212A}ate@example.com", "kate@example.com"),
            ("\u{0130}da@example.com", "ida@example.com"),
            ("\u{017F}am@example.com", "sam@example.com"),
            ("\u{00C5}sa@example.com", "\u{00E5}sa@example.com"),
        ] {
            assert_ne!(
                normalize_address(unicode).unwrap(),
                normalize_address(ascii).unwrap()
            );
        }
        assert_eq!(
            normalize_address("\u{00C5}sa@Example.COM").unwrap(),
            "\u{00C5}sa@example.com"
        );
    }
}
