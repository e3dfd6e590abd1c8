//! The data directories' lock: two stores never open one directory.

use berth_store::{Store, StoreConfig, StoreError};

#[test]
fn a_second_open_of_a_locked_data_dir_is_refused_until_the_first_closes() {
    let dir = std::env::temp_dir().join(format!("berth-lock-{}", std::process::id()));
    let _may_not_exist = std::fs::remove_dir_all(&dir);
    let mut cfg = StoreConfig::new(dir.clone());
    cfg.log_groups = 1;
    let (first, _) = Store::open(cfg.clone()).expect("first open");
    match Store::open(cfg.clone()) {
        Err(StoreError::Config(msg)) => {
            assert!(msg.contains("in use by another berth process"), "{msg}");
            assert!(msg.contains("LOCK"), "{msg}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a locked data directory opened twice"),
    }
    first.close().unwrap();
    let (again, _) = Store::open(cfg).expect("open after close");
    again.close().unwrap();
    let _cleanup = std::fs::remove_dir_all(&dir);
}
