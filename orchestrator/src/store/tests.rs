use super::*;

#[tokio::test]
async fn records_round_trip_and_a_newer_format_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path()).unwrap();
    let tree: Tree<Vec<u32>> = db.tree("numbers").unwrap();
    tree.put("b", &vec![2]).await.unwrap();
    tree.put("a", &vec![1]).await.unwrap();
    assert_eq!(tree.all().unwrap(), vec![vec![1], vec![2]]);
    assert_eq!(tree.get("a").unwrap(), Some(vec![1]));
    assert_eq!(tree.get("z").unwrap(), None);

    tree.tree.insert("c", vec![9u8, b'1']).unwrap();
    let error = tree.get("c").unwrap_err().to_string();
    assert!(error.contains("record format 9"), "{error}");
    drop(tree);
    drop(db);
    // Reopened: still there.
    let db = Db::open(dir.path()).unwrap();
    let tree: Tree<Vec<u32>> = db.tree("numbers").unwrap();
    assert_eq!(tree.get("b").unwrap(), Some(vec![2]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_writers_share_flushes_and_every_write_lands() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path()).unwrap();
    let tree: Tree<u64> = db.tree("numbers").unwrap();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..64u64 {
        let tree = tree.clone();
        writers.spawn(async move {
            for i in 0..50u64 {
                tree.put(&format!("{writer:03}-{i:03}"), &(writer * 1000 + i))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    let health = db.health();
    assert_eq!(health.writes, 64 * 50);
    assert!(health.flushes < health.writes, "no write shared a flush: {health:?}");
    assert!(!health.stalled);
    drop(tree);
    drop(db);
    let db = Db::open(dir.path()).unwrap();
    let tree: Tree<u64> = db.tree("numbers").unwrap();
    assert_eq!(tree.len(), 64 * 50);
}

#[tokio::test]
async fn a_batch_over_several_trees_is_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path()).unwrap();
    let runs: Tree<String> = db.tree("runs").unwrap();
    let keys: Tree<String> = db.tree("keys").unwrap();
    let mut batch = WriteBatch::new();
    batch
        .put(&runs, "r1", &"run".to_owned())
        .put(&keys, "k1", &"r1".to_owned());
    batch.put(&runs, "r2", &"run".to_owned());
    db.commit(batch).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(keys.get("k1").unwrap().as_deref(), Some("r1"));
    let mut batch = WriteBatch::new();
    batch.remove(&runs, "r2");
    db.commit_blocking(batch).unwrap();
    assert_eq!(runs.get("r2").unwrap(), None);
}

#[tokio::test]
async fn a_stuck_writer_is_unhealthy_and_writes_fail_at_their_deadline_then_recover() {
    let db = Db::temporary().unwrap();
    db.set_limits(Duration::from_millis(300), Duration::from_millis(100));
    let tree: Tree<u32> = db.tree("numbers").unwrap();
    let hold = db.hold_writer();
    let error = tree.put("a", &1).await.unwrap_err();
    assert!(matches!(error, StoreError::Stalled { .. }), "{error}");
    assert!(error.is_unavailable());
    assert!(error.to_string().contains("retry later"), "{error}");
    let health = db.health();
    assert!(health.stalled, "{health:?}");
    assert!(health.busy_ms >= 100, "{health:?}");
    assert_eq!(health.refused, 1);
    // A blocking caller gets the same, not a hang.
    let blocking = tree.clone();
    let error = tokio::task::spawn_blocking(move || blocking.put_blocking("b", &2))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(error, StoreError::Stalled { .. }), "{error}");
    drop(hold);
    // Unstuck: healthy again, and new writes are acknowledged.
    tree.put("c", &3).await.unwrap();
    assert!(!db.health().stalled);
    assert_eq!(tree.get("c").unwrap(), Some(3));
}

#[test]
fn a_full_queue_refuses_at_once() {
    let db = Db::temporary().unwrap();
    let tree: Tree<u32> = db.tree("numbers").unwrap();
    let hold = db.hold_writer();
    // Wait until the writer holds (the hold request is taken off the queue).
    while db.health().busy_ms == 0 && db.health().queued > 0 {
        std::thread::yield_now();
    }
    let mut refused = None;
    for i in 0..=WRITE_QUEUE + 1 {
        let mut batch = WriteBatch::new();
        batch.put(&tree, &i.to_string(), &1);
        let (reply, _answer) = std::sync::mpsc::sync_channel(1);
        if let Err(error) = db.writer.enqueue(Request::Write {
            batch,
            reply: Reply::Blocking(reply),
        }) {
            refused = Some(error);
            break;
        }
    }
    assert!(matches!(refused, Some(StoreError::Overloaded)), "{refused:?}");
    drop(hold);
}
