//! A peer's certificate turned into a user name (EXTERNAL login): the
//! bytes come from a TLS client, verified by a CA but otherwise untrusted.
//!
//! Checked besides "no panic": every kind of name is asked for, and a
//! common name, when there is one, is part of the rendered subject DN.
#![no_main]

use berth_certname::{common_name, distinguished_name, san, SanType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cn = common_name(data);
    let dn = distinguished_name(data);
    for kind in [
        SanType::Dns,
        SanType::Email,
        SanType::Uri,
        SanType::OtherName,
    ] {
        for index in [0, 1, u32::MAX] {
            let _name_or_none = san(data, kind, index);
        }
    }
    if let (Some(cn), Some(dn)) = (cn, dn) {
        let unescaped = dn.replace('\\', "");
        assert!(
            unescaped.contains(&cn.replace('\\', "")),
            "CN {cn:?} not in DN {dn:?}"
        );
    }
});
