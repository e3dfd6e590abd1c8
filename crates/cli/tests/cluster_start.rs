//! A cluster member's start as an operator meets it: a peer list written
//! as RabbitMQ writes node lists (one comma-separated value), and a start
//! that fails on bad state says why and exits, never panics.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::cluster::{berth_bin, free_port};

fn secret(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("secret");
    std::fs::write(&path, "a test secret of more than sixteen bytes\n").unwrap();
    path
}

/// `berth serve` as member n1 of three, with `extra` flags; its exit
/// status and stderr once it ends or after `wait` (then killed: `None`).
fn serve(dir: &std::path::Path, peers: &[String], wait: Duration) -> (Option<i32>, String) {
    let cluster = free_port();
    let mut cmd = Command::new(berth_bin());
    cmd.args([
        "serve",
        "--amqp-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ])
    .arg("--data-dir")
    .arg(dir.join("data"))
    .args(["--cluster-node-id", "n1", "--cluster-listen"])
    .arg(format!("127.0.0.1:{cluster}"))
    .arg("--cluster-secret-file")
    .arg(secret(dir));
    for p in peers {
        cmd.args(["--cluster-peer", &p.replace("PORT", &cluster.to_string())]);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start berth");
    let deadline = Instant::now() + wait;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (status, err)
}

/// `--cluster-peer a@h:p,b@h:p,c@h:p` was read as one peer whose address
/// was `h:p,b@h:p,c@h:p`, and refused with "must list this node (n1)"
/// unless this node came first.
#[test]
fn peers_in_one_comma_separated_value_are_the_same_list() {
    let dir = berth_testdir::TestDir::new("cluster-start-peers");
    let peers = ["n2@127.0.0.1:1, n3@127.0.0.1:2,n1@127.0.0.1:PORT".to_owned()];
    let (status, err) = serve(dir.path(), &peers, Duration::from_secs(3));
    assert_eq!(
        status, None,
        "a member given its peers in one value runs (exit {status:?}): {err}"
    );
    assert!(err.contains("cluster member started"), "{err}");
}

/// A start that fails (here: a damaged `raft.snapshot`) said nothing of
/// its cause: dropping Raft's runtime inside the broker's panicked
/// ("Cannot drop a runtime in a context where blocking is not allowed"),
/// exit 101. It must name the file and what is wrong, and exit non-zero.
#[test]
fn a_start_that_fails_says_why_and_never_panics() {
    let dir = berth_testdir::TestDir::new("cluster-start-damaged");
    let raft = dir.path().join("data").join("cluster");
    std::fs::create_dir_all(&raft).unwrap();
    std::fs::write(raft.join("raft.snapshot"), b"not a snapshot at all").unwrap();
    let peers = [
        "n1@127.0.0.1:PORT".to_owned(),
        "n2@127.0.0.1:1".to_owned(),
        "n3@127.0.0.1:2".to_owned(),
    ];
    let (status, err) = serve(dir.path(), &peers, Duration::from_secs(30));
    assert!(
        !err.contains("panicked"),
        "a panic instead of the cause: {err}"
    );
    assert!(
        matches!(status, Some(c) if c != 0 && c != 101),
        "exit {status:?}: {err}"
    );
    assert!(
        err.contains("raft.snapshot") && err.contains("cannot start the cluster member"),
        "the cause, naming the file: {err}"
    );
}
