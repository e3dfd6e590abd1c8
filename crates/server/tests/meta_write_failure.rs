//! A definition delete whose durable write fails fails the operation: the
//! client gets an error, not a `delete-ok` for a change that a restart
//! would undo. Driven through the real store with its fault-injecting
//! storage (every fdatasync fails from a chosen point on), behind the
//! server's journal, as `berth serve` wires them.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use berth_broker::durable::Journal;
use berth_broker::exchange::ExchangeDeclare;
use berth_broker::vhost::{QueueDeclare, VHost};
use berth_broker::Broker;
use berth_protocol::FieldTable;
use berth_server::store_journal::StoreJournal;
use berth_store::fault::FaultStorage;
use berth_store::{Store, StoreConfig};

const CONNECTION: u64 = 1;

/// A broker over a store on fault storage, with a durable exchange `ex`,
/// a durable queue `q` and a binding `ex` → `q` (key `k`).
fn broker_with_definitions(fs: &FaultStorage) -> Arc<VHost> {
    let mut config = StoreConfig::new("/data");
    config.log_groups = 2;
    let (store, _) = Store::open_with(config, Arc::new(fs.clone())).expect("open store");
    let journal = Arc::new(StoreJournal {
        store,
        events: OnceLock::new(),
    });
    let broker = Broker::with_journal(["/"], journal as Arc<dyn Journal>, 1, 1);
    let vhost = broker.vhost("/").expect("vhost /");
    vhost
        .declare_exchange(
            "ex",
            &ExchangeDeclare {
                kind: "direct".into(),
                durable: true,
                ..ExchangeDeclare::default()
            },
        )
        .expect("declare exchange");
    let durable = QueueDeclare {
        durable: true,
        ..QueueDeclare::default()
    };
    vhost
        .declare_queue(CONNECTION, "q", &durable, Instant::now())
        .expect("declare queue");
    vhost
        .bind_queue(CONNECTION, "q", "ex", "k", &FieldTable::default())
        .expect("bind");
    vhost
}

#[test]
fn a_queue_delete_that_is_not_durable_is_refused_and_the_queue_stays() {
    let fs = FaultStorage::new(11);
    let vhost = broker_with_definitions(&fs);
    fs.fail_syncs_after(Some(0));
    let err = vhost
        .delete_queue(CONNECTION, "q", false, false)
        .expect_err("a delete that never became durable must not be answered delete-ok");
    assert!(err.reply_code >= 500, "a server error, got {err:?}");
    assert!(
        vhost.queue(CONNECTION, "q").is_ok(),
        "the queue must stay, as a restart would bring it back"
    );
}

#[test]
fn an_exchange_delete_that_is_not_durable_is_refused_and_the_exchange_stays() {
    let fs = FaultStorage::new(12);
    let vhost = broker_with_definitions(&fs);
    fs.fail_syncs_after(Some(0));
    vhost
        .delete_exchange("ex", false)
        .expect_err("a delete that never became durable must not be answered delete-ok");
    assert!(vhost.exchange("ex").is_ok(), "the exchange must stay");
}

#[test]
fn an_unbind_that_is_not_durable_is_refused() {
    let fs = FaultStorage::new(13);
    let vhost = broker_with_definitions(&fs);
    fs.fail_syncs_after(Some(0));
    vhost
        .unbind_queue(CONNECTION, "q", "ex", "k", &FieldTable::default())
        .expect_err("an unbind that never became durable must not be answered unbind-ok");
}
