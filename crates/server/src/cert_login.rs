//! The user name a verified client certificate carries, for `EXTERNAL`:
//! the rules live in `berth-certname` (parsed with a maintained X.509
//! parser, fuzzed on its own); this module keeps the server's path to them.

pub use berth_certname::{common_name, distinguished_name, san, CertLogin, LoginFrom, SanType};
