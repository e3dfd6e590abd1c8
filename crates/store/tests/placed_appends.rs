//! The group writer places each batch for the offset it goes to
//! (`append_buf.rs`), so that an append past the page cache writes it from
//! where it was encoded instead of copying it to aligned memory first.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use berth_store::fault::FaultStorage;
use berth_store::hooked::{FileHooks, Hooked};
use berth_store::{QueueId, Store};
use bytes::Bytes;
use common::{config, wait};

/// Counts appends, placed and not: the writer's batches, and the zeros of
/// each prepared segment (one append per segment here, always placed). A
/// prepared segment keeps the path it was created under, so the two are
/// not told apart by path.
#[derive(Default)]
struct Placement {
    placed: AtomicU64,
    not_placed: AtomicU64,
}

impl FileHooks for Placement {
    fn before_append(&self, _path: &Path, placed: bool) {
        let count = if placed {
            &self.placed
        } else {
            &self.not_placed
        };
        count.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn the_writer_places_its_batches_for_the_offsets_they_go_to() {
    let seen = Arc::new(Placement::default());
    let storage = Hooked {
        inner: FaultStorage::new(11),
        hooks: Arc::clone(&seen),
    };
    // 64 KiB segments: batches at every offset within a block, rolls,
    // and segments prepared ahead.
    let cfg = config(1);
    assert!(cfg.direct_appends);
    let (store, _) = Store::open_with(cfg, Arc::new(storage)).expect("open");
    let sizes = [100usize, 3_000, 9_000, 20_000, 1, 4_095, 500, 13_333];
    for i in 0..300 {
        let m = store.next_msg_id();
        let body = Bytes::from(vec![7u8; sizes[i % sizes.len()]]);
        wait(|d| store.publish(m, &[QueueId(1)], body, Some(d))).unwrap();
    }
    drop(store);
    let placed = seen.placed.load(Ordering::Relaxed);
    let not_placed = seen.not_placed.load(Ordering::Relaxed);
    eprintln!("{placed} appends placed, {not_placed} not");
    // A batch larger than any before it moves the buffer while it is
    // encoded (at most three times here: 9,000, 13,333 and 20,000 bytes,
    // after the room reserved for the first); every other one of the 300
    // is written from where it lies. Unplaced, the writer's batches would
    // leave little more than the prepared segments' zeros placed.
    assert!(placed >= 290, "only {placed} appends placed");
    assert!(
        not_placed <= 4,
        "{not_placed} appends were not placed for their offset ({placed} were)"
    );
}
