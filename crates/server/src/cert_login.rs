//! The user name a verified client certificate carries, for `EXTERNAL`,
//! taken as RabbitMQ's `ssl_cert_login_from` says: the subject's common
//! name, the whole subject distinguished name (RFC 4514 as RabbitMQ and
//! `openssl -nameopt RFC2253` render it: last RDN first, `,` between RDNs,
//! `+` inside one, special characters escaped with `\`), or one subject
//! alternative name of a given type by its index among names of that type.
//!
//! Invariants:
//! - Nothing here trusts the certificate's bytes: every length is checked
//!   and anything malformed yields no name (so `EXTERNAL` is not offered),
//!   never a panic.

use std::fmt::Write as _;

use serde::Deserialize;

/// Where the user name comes from (`tls.cert_login_from`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoginFrom {
    /// The subject's CN (RabbitMQ's `common_name`).
    #[default]
    CommonName,
    /// The subject DN as an RFC 4514 string (`distinguished_name`).
    DistinguishedName,
    /// A SAN (`subject_alternative_name`, also spelled `subject_alt_name`).
    #[serde(alias = "subject_alt_name")]
    SubjectAlternativeName,
}

/// Which SANs count (`tls.cert_login_san_type`, RabbitMQ's
/// `ssl_cert_login_san_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SanType {
    #[default]
    Dns,
    Email,
    Uri,
    /// An `otherName` whose value is a string (e.g. a UPN).
    OtherName,
}

impl SanType {
    /// The context tag of this kind of `GeneralName` (RFC 5280).
    fn tag(self) -> u8 {
        match self {
            Self::OtherName => 0xA0,
            Self::Email => 0x81,
            Self::Dns => 0x82,
            Self::Uri => 0x86,
        }
    }
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

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_SAN: &[u8] = &[0x55, 0x1D, 0x11];

/// The TBSCertificate's fields after the version: serial, signature,
/// issuer, validity, subject, subjectPublicKeyInfo, then optional ones.
fn tbs_fields(der: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let (_, cert, _) = tlv(der)?;
    let (_, mut tbs, _) = tlv(cert)?;
    let mut out = Vec::new();
    while !tbs.is_empty() {
        let (tag, content, rest) = tlv(tbs)?;
        if !(out.is_empty() && tag == 0xA0) {
            out.push((tag, content));
        }
        tbs = rest;
    }
    Some(out)
}

/// One attribute of an RDN: (attribute OID, value's DER tag, value).
type Attribute<'a> = (&'a [u8], u8, &'a [u8]);

/// The subject's RDNs, each a list of attributes.
fn subject(der: &[u8]) -> Option<Vec<Vec<Attribute<'_>>>> {
    let fields = tbs_fields(der)?;
    let &(_, mut name) = fields.get(4)?;
    let mut rdns = Vec::new();
    while !name.is_empty() {
        let (_, mut set, rest) = tlv(name)?;
        name = rest;
        let mut rdn = Vec::new();
        while !set.is_empty() {
            let (_, atv, rest) = tlv(set)?;
            set = rest;
            let (tag, oid, value) = tlv(atv)?;
            if tag != 0x06 {
                return None;
            }
            let (vtag, v, _) = tlv(value)?;
            rdn.push((oid, vtag, v));
        }
        rdns.push(rdn);
    }
    Some(rdns)
}

/// The subject common name (CN), RabbitMQ's `common_name`.
pub fn common_name(der: &[u8]) -> Option<String> {
    subject(der)?
        .into_iter()
        .flatten()
        .find(|(oid, _, _)| *oid == OID_CN)
        .and_then(|(_, tag, v)| text(tag, v))
}

/// The subject DN as RabbitMQ renders it (RFC 4514, last RDN first).
pub fn distinguished_name(der: &[u8]) -> Option<String> {
    let rdns = subject(der)?;
    let mut out = String::new();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, (oid, tag, v)) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            out.push_str(&attribute_name(oid)?);
            out.push('=');
            match text(*tag, v) {
                Some(s) => escape_into(&mut out, &s),
                None => {
                    // Not a string: RFC 4514's `#` and the hex of the DER.
                    out.push('#');
                    let _ = write!(out, "{tag:02x}");
                    for b in encode_length(v.len()).iter().chain(v.iter()) {
                        let _ = write!(out, "{b:02x}");
                    }
                }
            }
        }
    }
    Some(out)
}

/// The `index`-th SAN of type `kind`.
pub fn san(der: &[u8], kind: SanType, index: u32) -> Option<String> {
    let fields = tbs_fields(der)?;
    let &(_, mut exts) = fields.iter().find(|(tag, _)| *tag == 0xA3)?;
    exts = tlv(exts)?.1;
    while !exts.is_empty() {
        let (_, mut ext, rest) = tlv(exts)?;
        exts = rest;
        let (_, oid, after) = tlv(ext)?;
        if oid != OID_SAN {
            continue;
        }
        ext = after;
        if ext.first() == Some(&0x01) {
            ext = tlv(ext)?.2; // critical
        }
        let (_, octets, _) = tlv(ext)?;
        let (_, mut names, _) = tlv(octets)?;
        let mut seen = 0u32;
        while !names.is_empty() {
            let (tag, v, rest) = tlv(names)?;
            names = rest;
            if tag != kind.tag() {
                continue;
            }
            if seen == index {
                return if kind == SanType::OtherName {
                    // type-id OID, then [0] EXPLICIT value.
                    let (_, _, after_oid) = tlv(v)?;
                    let (_, explicit, _) = tlv(after_oid)?;
                    let (t, s, _) = tlv(explicit)?;
                    text(t, s)
                } else {
                    String::from_utf8(v.to_vec()).ok()
                };
            }
            seen += 1;
        }
    }
    None
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
            let _ = write!(out, ".{n}");
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

/// One DER tag-length-value: (tag, content, the bytes after it).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)?;
    let (len, head) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*b.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    Some((tag, b.get(head..end)?, b.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::{dotted_oid, escape_into, tlv};

    #[test]
    fn der_lengths_short_and_long_form_and_truncation() {
        assert_eq!(
            tlv(&[0x04, 0x01, 0xAA, 0xBB]),
            Some((0x04, &[0xAA][..], &[0xBB][..]))
        );
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend(std::iter::repeat_n(0u8, 0x80));
        assert_eq!(tlv(&long).map(|t| t.1.len()), Some(0x80));
        assert_eq!(tlv(&[0x04, 0x05, 0x00]), None, "truncated content");
        assert_eq!(tlv(&[0x04, 0x85, 1, 1, 1, 1, 1]), None, "length too long");
    }

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
