//! Two topics, each to its own statement and table, through the binary and a real broker, with
//! a `kill -9` of the processor in the middle: the tables end exactly as the model says, dead
//! letters name their topic, and a replay by a new group changes nothing. Routes that do not fit
//! the topics are refused before anything is consumed.

use std::collections::BTreeMap;

use super::*;

fn order(n: u32) -> RawRecord {
    // Every tenth order has a quantity the statement rejects.
    let quantity = if n % 10 == 0 { 0 } else { n % 7 + 1 };
    let value = format!("{{\"order_id\": \"o-{n}\", \"sku\": \"A{n}\", \"quantity\": {quantity}}}");
    record((n % 2) as i32, n, None, &value)
}

/// Customer `k<i>` of round `round`, always on the same partition (as a key partitioner would).
fn customer(round: u32, i: u32) -> RawRecord {
    let key = format!("k{i}");
    let doc = format!("{{\"n\": {}}}", round * 100 + i);
    record(
        (i % 2) as i32,
        1000 + round * 100 + i,
        Some(key.as_bytes()),
        &doc,
    )
}

fn customer_tombstone(i: u32) -> RawRecord {
    RawRecord {
        partition: (i % 2) as i32,
        key: Some(format!("k{i}").into_bytes()),
        value: None,
        headers: Vec::new(),
        timestamp_ms: None,
    }
}

/// Both topics to their statements, in batches of 5; with `until_eof`, until both are drained.
fn spawn_both(
    url: &str,
    broker: &Broker,
    (orders, customers): (&str, &str),
    group: &str,
    until_eof: bool,
) -> Running {
    let group = Broker::group(orders, group);
    let topics = format!("{orders},{customers}");
    let orders_sql = format!("{orders}={}", example("orders_reject.sql").display());
    let customers_sql = format!("{customers}={}", example("customers.sql").display());
    let mut args = vec![
        "run",
        "--database-url",
        url,
        "--brokers",
        &broker.addr,
        "--topic",
        &topics,
        "--group",
        &group,
        "--handler",
        "sql",
        "--apply-sql",
        &orders_sql,
        "--apply-sql",
        &customers_sql,
        "--batch-size",
        "5",
        "--log-interval",
        "0",
    ];
    if until_eof {
        args.push("--exit-on-eof");
    }
    Running::spawn(&args, &[("RUST_LOG", "warn")])
}

async fn orders_table(pool: &Pool) -> BTreeMap<String, (String, i32, String)> {
    let c = pool.get().await.unwrap();
    let rows = c
        .query(
            "SELECT order_id, sku, quantity, message_id::text FROM orders",
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_topics_go_to_two_tables_exactly_through_a_kill() {
    let broker = Broker::start();
    let orders = broker.topic("sql-route-orders");
    let customers_topic = broker.topic("sql-route-customers");
    let (url, pool) = db_with("sql_two_topics", "orders.ddl.sql").await;
    let ddl = std::fs::read_to_string(example("customers.ddl.sql")).unwrap();
    pool.get().await.unwrap().batch_execute(&ddl).await.unwrap();

    let first: Vec<RawRecord> = (1..=150).map(order).collect();
    produce(&broker, &orders, 2, &first).await;
    let rounds: Vec<RawRecord> = (1..=3)
        .flat_map(|round| (0..20).map(move |i| customer(round, i)))
        .collect();
    produce(&broker, &customers_topic, 2, &rounds).await;

    let topics = (orders.as_str(), customers_topic.as_str());
    let running = spawn_both(&url, &broker, topics, "g", false);
    crate::common::group::wait_for("some orders applied", 60, || async {
        count(&pool, "SELECT count(*) FROM orders").await >= 20
    })
    .await;
    let killed = running.kill().await;
    assert_eq!(killed.code, None, "killed: {}", killed.stderr);

    // More of both while it is down, and resends of the first 30 orders.
    let second: Vec<RawRecord> = (151..=300).chain(1..=30).map(order).collect();
    produce(&broker, &orders, 2, &second).await;
    let mut more: Vec<RawRecord> = (0..5).map(customer_tombstone).collect();
    more.extend((5..10).map(|i| customer(4, i)));
    produce(&broker, &customers_topic, 2, &more).await;

    let finished = spawn_both(&url, &broker, topics, "g", true)
        .wait(Duration::from_secs(120))
        .await;
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);

    let expected_orders: BTreeMap<String, (String, i32, String)> = (1..=300)
        .filter(|n| n % 10 != 0)
        .map(|n| {
            let quantity = (n % 7 + 1) as i32;
            (format!("o-{n}"), (format!("A{n}"), quantity, uuid(n)))
        })
        .collect();
    assert_eq!(orders_table(&pool).await, expected_orders);
    let expected_customers: Vec<(String, String)> = (5..20)
        .map(|i| {
            let round = if i < 10 { 4 } else { 3 };
            (format!("k{i}"), format!("{{\"n\": {}}}", round * 100 + i))
        })
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect();
    let got_customers: Vec<(String, String)> = customers(&pool)
        .await
        .into_iter()
        .map(|(k, doc, _)| (k, doc))
        .collect();
    assert_eq!(got_customers, expected_customers);
    let c = pool.get().await.unwrap();
    let letters: Vec<(String, String, String)> = c
        .query(
            "SELECT topic, message_id, reason FROM dead_letters ORDER BY message_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut expected_letters: Vec<(String, String, String)> = (1..=30)
        .map(|k| (orders.clone(), uuid(k * 10), "invalid_quantity".to_owned()))
        .collect();
    expected_letters.sort();
    assert_eq!(letters, expected_letters);
    // Each order id once (300), each customer record once: 60 upserts, 5 tombstones (keys of
    // their positions), 5 upserts.
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 300 + 70);
    let per_topic: Vec<(String, i64)> = c
        .query(
            "SELECT topic, count(*) FROM inbox GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut expected_per_topic = vec![(orders.clone(), 300), (customers_topic.clone(), 70)];
    expected_per_topic.sort();
    assert_eq!(per_topic, expected_per_topic);

    let replay = spawn_both(&url, &broker, topics, "replay", true)
        .wait(Duration::from_secs(120))
        .await;
    let [records, new, ..] = summary(&replay);
    assert_eq!((records, new), (330 + 70, 0), "{}", replay.stdout);
    assert_eq!(orders_table(&pool).await, expected_orders);
    assert_eq!(count(&pool, "SELECT count(*) FROM dead_letters").await, 30);
    assert_eq!(count(&pool, "SELECT count(*) FROM inbox").await, 370);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_that_do_not_fit_the_topics_are_refused_at_start() {
    let sql = example("customers.sql");
    let sql = sql.to_str().unwrap();
    let a_sql = format!("a={sql}");
    let c_sql = format!("c={sql}");
    for (flags, line) in [
        (
            vec!["--topic", "a,b", "--apply-sql", a_sql.as_str()],
            "error: topic \"b\" has no statement: add --apply-sql b=FILE, or a bare \
             --apply-sql FILE for every topic without one",
        ),
        (
            vec![
                "--topic",
                "a",
                "--apply-sql",
                a_sql.as_str(),
                "--apply-sql",
                c_sql.as_str(),
            ],
            "error: --apply-sql names topic \"c\", which is not consumed (--topic a)",
        ),
        (
            vec!["--topic", "a", "--apply-sql", sql, "--apply-sql", sql],
            "error: --apply-sql gives two statements for every topic (FILE without TOPIC=)",
        ),
    ] {
        let mut args = vec![
            "run",
            "--handler",
            "sql",
            "--database-url",
            "postgres://nowhere/x",
        ];
        args.extend(flags.iter().copied());
        let run = Running::spawn(&args, &[])
            .wait(Duration::from_secs(30))
            .await;
        assert_eq!(run.code, Some(2), "{flags:?}: {}", run.stderr);
        assert_eq!(run.stderr.trim(), line, "{flags:?}");
    }
    for (flags, part) in [
        (
            vec!["--tombstones", "pass"],
            "--tombstones pass needs --handler sql",
        ),
        (
            vec!["--value-format", "text"],
            "--value-format is the SQL handler's",
        ),
    ] {
        let mut args = vec!["run", "--database-url", "postgres://nowhere/x"];
        args.extend(flags.iter().copied());
        let run = Running::spawn(&args, &[])
            .wait(Duration::from_secs(30))
            .await;
        assert_eq!(run.code, Some(2), "{flags:?}: {}", run.stderr);
        assert!(run.stderr.contains(part), "{flags:?}: {}", run.stderr);
    }
}
