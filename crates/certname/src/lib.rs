//! The user name a verified client certificate carries, for `EXTERNAL`,
//! taken as RabbitMQ's `ssl_cert_login_from` says: the subject's common
//! name, the whole subject distinguished name (RFC 4514 as RabbitMQ and
//! `openssl -nameopt RFC2253` render it: last RDN first, `,` between RDNs,
//! `+` inside one, special characters escaped with `\`), or one subject
//! alternative name of a given type by its index among names of that type.
//!
//! The certificate is parsed by `x509-parser` (a maintained X.509 parser);
//! this crate only chooses the name and renders it as RabbitMQ does. It is
//! a crate of its own so that the fuzz target (`fuzz/fuzz_targets/certname.rs`)
//! reaches it without building the server.
//!
//! Invariants:
//! - Nothing here trusts the certificate's bytes: anything the parser
//!   refuses, or a name that is not text, yields no name (so `EXTERNAL` is
//!   not offered), never a panic.

use std::fmt::Write as _;

use x509_parser::asn1_rs::{Any, Class, FromDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::x509::X509Name;

/// Where the user name comes from (`tls.cert_login_from`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoginFrom {
    /// The subject's CN (RabbitMQ's `common_name`).
    #[default]
    CommonName,
    /// The subject DN as an RFC 4514 string (`distinguished_name`).
    DistinguishedName,
    /// A SAN (`subject_alternative_name`, also spelled `subject_alt_name`).
    SubjectAlternativeName,
}

/// Which SANs count (`tls.cert_login_san_type`, RabbitMQ's
/// `ssl_cert_login_san_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SanType {
    #[default]
    Dns,
    Email,
    Uri,
    /// An `otherName` whose value is a string (e.g. a UPN).
    OtherName,
}

impl std::str::FromStr for LoginFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "common_name" => Ok(Self::CommonName),
            "distinguished_name" => Ok(Self::DistinguishedName),
            "subject_alternative_name" | "subject_alt_name" => Ok(Self::SubjectAlternativeName),
            _ => Err(format!(
                "expected common_name, distinguished_name or subject_alternative_name, got '{s}'"
            )),
        }
    }
}

impl std::str::FromStr for SanType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dns" => Ok(Self::Dns),
            "email" => Ok(Self::Email),
            "uri" => Ok(Self::Uri),
            "other_name" => Ok(Self::OtherName),
            _ => Err(format!(
                "expected dns, email, uri or other_name, got '{s}' (ip is not supported)"
            )),
        }
    }
}

/// How to name the user of a client certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CertLogin {
    pub from: LoginFrom,
    pub san_type: SanType,
    /// 0-based among the SANs of `san_type`.
    pub san_index: u32,
}

impl CertLogin {
    /// The user name in the DER certificate `der`, if it has one.
    pub fn user_name(&self, der: &[u8]) -> Option<String> {
        match self.from {
            LoginFrom::CommonName => common_name(der),
            LoginFrom::DistinguishedName => distinguished_name(der),
            LoginFrom::SubjectAlternativeName => san(der, self.san_type, self.san_index),
        }
    }
}

/// The parsed certificate, if `der` is one whole certificate.
fn parse(der: &[u8]) -> Option<X509Certificate<'_>> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Some(cert),
        _ => None,
    }
}

/// The subject common name (CN), RabbitMQ's `common_name`.
pub fn common_name(der: &[u8]) -> Option<String> {
    let cert = parse(der)?;
    let cn = cert.subject().iter_common_name().next()?;
    value_text(cn.attr_value())
}

/// The subject DN as RabbitMQ renders it (RFC 4514, last RDN first).
pub fn distinguished_name(der: &[u8]) -> Option<String> {
    let cert = parse(der)?;
    render_dn(cert.subject())
}

fn render_dn(name: &X509Name<'_>) -> Option<String> {
    let mut out = String::new();
    let rdns: Vec<_> = name.iter().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            out.push_str(&attribute_name(atv.attr_type().as_bytes())?);
            out.push('=');
            let value = atv.attr_value();
            match value_text(value) {
                Some(s) => escape_into(&mut out, &s),
                None => {
                    // Not a string: RFC 4514's `#` and the hex of the DER.
                    out.push('#');
                    let _infallible = write!(out, "{:02x}", tag_byte(value)?);
                    for b in encode_length(value.data.len()).iter().chain(value.data) {
                        let _infallible = write!(out, "{b:02x}");
                    }
                }
            }
        }
    }
    Some(out)
}

/// The identifier octet of a value whose tag fits in one (the only kind
/// the hex form above needs; a longer tag yields no name).
fn tag_byte(value: &Any<'_>) -> Option<u8> {
    let number = u8::try_from(value.tag().0).ok().filter(|n| *n < 31)?;
    let class = match value.class() {
        Class::Universal => 0x00,
        Class::Application => 0x40,
        Class::ContextSpecific => 0x80,
        Class::Private => 0xC0,
    };
    let constructed = if value.header.is_constructed() {
        0x20
    } else {
        0
    };
    Some(class | constructed | number)
}

/// A string value as text (see [`text`]); `None` for other types.
fn value_text(value: &Any<'_>) -> Option<String> {
    if value.class() != Class::Universal || value.header.is_constructed() {
        return None;
    }
    text(u8::try_from(value.tag().0).ok()?, value.data)
}

/// The `index`-th SAN of type `kind`.
pub fn san(der: &[u8], kind: SanType, index: u32) -> Option<String> {
    let cert = parse(der)?;
    let ext = cert.subject_alternative_name().ok()??;
    let mut of_kind = ext.value.general_names.iter().filter(|n| {
        matches!(
            (kind, n),
            (SanType::Dns, GeneralName::DNSName(_))
                | (SanType::Email, GeneralName::RFC822Name(_))
                | (SanType::Uri, GeneralName::URI(_))
                | (SanType::OtherName, GeneralName::OtherName(..))
        )
    });
    match of_kind.nth(usize::try_from(index).ok()?)? {
        GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
            Some((*s).to_owned())
        }
        // After the type-id OID: `[0] EXPLICIT` around the value.
        GeneralName::OtherName(_, explicit) => {
            let (_, wrapper) = Any::from_der(explicit).ok()?;
            let (_, value) = Any::from_der(wrapper.data).ok()?;
            value_text(&value)
        }
        _ => None,
    }
}

/// RabbitMQ's short names for the attribute types it knows; the dotted
/// OID for others.
fn attribute_name(oid: &[u8]) -> Option<String> {
    const X520: &[(u8, &str)] = &[
        (3, "CN"),
        (4, "SN"),
        (5, "SERIALNUMBER"),
        (6, "C"),
        (7, "L"),
        (8, "ST"),
        (9, "STREET"),
        (10, "O"),
        (11, "OU"),
        (12, "TITLE"),
        (42, "GIVENNAME"),
        (43, "INITIALS"),
        (44, "GENERATIONQUALIFIER"),
        (65, "PSEUDONYM"),
    ];
    if let [0x55, 0x04, n] = oid {
        if let Some((_, name)) = X520.iter().find(|(k, _)| k == n) {
            return Some((*name).to_owned());
        }
    }
    match oid {
        // 1.2.840.113549.1.9.1
        [0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x09, 0x01] => {
            return Some("EMAILADDRESS".to_owned())
        }
        // 0.9.2342.19200300.100.1.25 and .1
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xF2, 0x2C, 0x64, 0x01, 0x19] => {
            return Some("DC".to_owned())
        }
        [0x09, 0x92, 0x26, 0x89, 0x93, 0xF2, 0x2C, 0x64, 0x01, 0x01] => {
            return Some("UID".to_owned())
        }
        _ => {}
    }
    dotted_oid(oid)
}

fn dotted_oid(oid: &[u8]) -> Option<String> {
    let (&first, rest) = oid.split_first()?;
    let mut out = format!("{}.{}", first / 40, first % 40);
    let mut n: u64 = 0;
    for &b in rest {
        n = n.checked_mul(128)? | u64::from(b & 0x7F);
        if b & 0x80 == 0 {
            let _infallible = write!(out, ".{n}");
            n = 0;
        }
    }
    Some(out)
}

/// A DER string value as text (UTF8, Printable, IA5, Teletex as
/// Latin-1, BMP as UTF-16).
fn text(tag: u8, v: &[u8]) -> Option<String> {
    match tag {
        0x0C | 0x13 | 0x16 => String::from_utf8(v.to_vec()).ok(),
        0x14 => Some(v.iter().map(|&b| char::from(b)).collect()),
        0x1E => {
            if !v.len().is_multiple_of(2) {
                return None;
            }
            let units: Vec<u16> = v
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// RFC 4514 escaping of an attribute value.
fn escape_into(out: &mut String, s: &str) {
    let last = s.chars().count().saturating_sub(1);
    for (i, c) in s.chars().enumerate() {
        let special = matches!(c, '"' | '+' | ',' | ';' | '<' | '>' | '\\')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
}

fn encode_length(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![u8::try_from(len).unwrap_or(0)];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|&b| b == 0)
        .collect();
    let mut out = vec![0x80 | u8::try_from(bytes.len()).unwrap_or(0)];
    out.extend(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::{dotted_oid, escape_into};

    #[test]
    fn rfc4514_escapes_specials_and_edge_spaces() {
        let mut s = String::new();
        escape_into(&mut s, " a,b+c\\d#e ");
        assert_eq!(s, "\\ a\\,b\\+c\\\\d#e\\ ");
        let mut s = String::new();
        escape_into(&mut s, "#x");
        assert_eq!(s, "\\#x");
    }

    #[test]
    fn unknown_attribute_types_are_dotted_oids() {
        // 1.3.6.1.4.1.311.60.2.1.3 (jurisdictionC)
        let oid = [
            0x2B, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x3C, 0x02, 0x01, 0x03,
        ];
        assert_eq!(
            dotted_oid(&oid).as_deref(),
            Some("1.3.6.1.4.1.311.60.2.1.3")
        );
    }
}
