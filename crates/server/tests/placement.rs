//! Ten durable queues over the real store's two log groups split five and
//! five (the store's group function alone put ids 1–10 seven to three,
//! so one group's writer and recovery thread did most of the work).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use berth_broker::vhost::QueueDeclare;
use berth_broker::Broker;
use berth_server::store_journal::StoreJournal;
use berth_store::fault::FaultStorage;
use berth_store::{QueueId, Store, StoreConfig};

#[test]
fn ten_durable_queues_fill_both_store_groups_evenly() {
    let mut config = StoreConfig::new("/data");
    config.log_groups = 2;
    let (store, _) = Store::open_with(config, Arc::new(FaultStorage::new(7))).expect("open store");
    let journal = Arc::new(StoreJournal {
        store,
        events: OnceLock::new(),
    });
    let broker = Broker::with_journal(["/"], journal.clone(), 1, 1);
    let v = broker.vhost("/").unwrap();
    let declare = QueueDeclare {
        durable: true,
        ..Default::default()
    };
    for i in 0..10 {
        v.declare_queue(1, &format!("q{i}"), &declare, Instant::now())
            .unwrap();
    }
    let mut per_group = [0; 2];
    for q in v.queues() {
        let id = q.store_id.expect("a durable queue is stored");
        per_group[journal.store.group_of(QueueId(id)) as usize] += 1;
    }
    assert_eq!(per_group, [5, 5], "queues per store group");
}
