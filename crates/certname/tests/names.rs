//! The names of a real certificate (made by `openssl req -x509` with the
//! subject `C=GB, O=Acme\, Inc., OU=Ops, CN=alice` and SANs of every
//! supported type), as RabbitMQ would take them; the expected DN is what
//! `openssl x509 -inform DER -in tests/data/alice.der -noout -subject
//! -nameopt RFC2253` prints.

use berth_certname::{common_name, distinguished_name, san, CertLogin, LoginFrom, SanType};

const ALICE: &[u8] = include_bytes!("data/alice.der");

#[test]
fn subject_common_name_and_rfc4514_distinguished_name() {
    assert_eq!(common_name(ALICE).as_deref(), Some("alice"));
    assert_eq!(
        distinguished_name(ALICE).as_deref(),
        Some("CN=alice,OU=Ops,O=Acme\\, Inc.,C=GB")
    );
}

#[test]
fn subject_alternative_names_by_type_and_index() {
    assert_eq!(
        san(ALICE, SanType::Dns, 0).as_deref(),
        Some("first.example")
    );
    assert_eq!(
        san(ALICE, SanType::Dns, 1).as_deref(),
        Some("second.example")
    );
    assert_eq!(san(ALICE, SanType::Dns, 2), None, "only two DNS names");
    assert_eq!(
        san(ALICE, SanType::Email, 0).as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(
        san(ALICE, SanType::Uri, 0).as_deref(),
        Some("https://example.com/alice")
    );
    assert_eq!(
        san(ALICE, SanType::OtherName, 0).as_deref(),
        Some("alice@corp.example")
    );
}

#[test]
fn login_setting_chooses_the_name() {
    let login = CertLogin {
        from: LoginFrom::SubjectAlternativeName,
        san_type: SanType::Dns,
        san_index: 1,
    };
    assert_eq!(login.user_name(ALICE).as_deref(), Some("second.example"));
    assert_eq!(
        CertLogin::default().user_name(ALICE).as_deref(),
        Some("alice")
    );
}

#[test]
fn damaged_or_truncated_certificates_have_no_name() {
    for cut in [0, 1, 10, ALICE.len() / 2, ALICE.len() - 1] {
        assert_eq!(common_name(&ALICE[..cut]), None, "cut at {cut}");
    }
    let mut trailing = ALICE.to_vec();
    trailing.push(0);
    assert_eq!(common_name(&trailing), None, "bytes after the certificate");
    let mut flipped = ALICE.to_vec();
    flipped[1] ^= 0xFF;
    assert_eq!(distinguished_name(&flipped), None, "outer length damaged");
}
