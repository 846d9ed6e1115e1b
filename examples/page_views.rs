//! `cargo run --example page_views`: a service of its own on the library, counting page views
//! per path in table `page_views`, each view exactly once. Kafka: `KAFKA_BROKERS`, else an
//! in-process mock cluster; PostgreSQL: `DATABASE_URL`, else database `batch_inbox_example`.
use std::{collections::BTreeMap, future::pending, sync::Arc};

use batch_inbox::{db, Handler, ProcessorConfig};
use batch_inbox::{Decode, HandlerError, KafkaSettings, Message, RawMessage, Reason};
use batch_inbox::{Rejection, Transaction};
use rdkafka::{message::OwnedHeaders, producer::FutureProducer, producer::FutureRecord};

/// The payload: `{"path": "/pricing"}`.
#[derive(Clone, serde::Deserialize)]
struct View {
    path: String,
}

impl Decode for View {
    fn decode(raw: &RawMessage) -> Result<Self, (Reason, String)> {
        let value = raw.payload.as_deref().unwrap_or_default();
        serde_json::from_slice(value).map_err(|e| (Reason::InvalidPayload, e.to_string()))
    }
}

/// Adds a batch's new views with one statement; refuses paths that do not start with `/`.
struct PageViews;

/// The reason a view is refused with, stored in `dead_letters.reason`.
const INVALID_PATH: Reason = Reason::rejected("invalid_path");

impl Handler for PageViews {
    type Payload = View;
    const REJECTIONS: &'static [Reason] = &[INVALID_PATH];

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        views: &[Message<View>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let (mut counts, mut refused) = (BTreeMap::<&str, i64>::new(), Vec::new());
        for (index, View { path }) in views.iter().map(|m| &m.payload).enumerate() {
            if path.starts_with('/') {
                *counts.entry(path).or_default() += 1;
            } else {
                refused.push(Rejection::new(index, INVALID_PATH, "no leading /"));
            }
        }
        let (paths, n): (Vec<&str>, Vec<i64>) = counts.into_iter().unzip();
        let upsert = "INSERT INTO page_views SELECT * FROM unnest($1::text[], $2::bigint[])
            ON CONFLICT (path) DO UPDATE SET views = page_views.views + excluded.views";
        tx.execute(upsert, &[&paths, &n]).await?;
        Ok(refused)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/batch_inbox_example".into());
    let pool = db::connect(&url, 4).await?;
    db::migrate(&pool).await?; // the inbox and dead_letters tables
    let db = pool.get().await?;
    db.batch_execute("CREATE TABLE IF NOT EXISTS page_views (path text PRIMARY KEY, views bigint)")
        .await?;
    let topic = format!("page-views-{}", uuid::Uuid::new_v4());
    let mock = rdkafka::mocking::MockCluster::new(1)?;
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| mock.bootstrap_servers());
    if brokers == mock.bootstrap_servers() {
        mock.create_topic(&topic, 2, 1)?; // another broker creates it on first use
    }
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()?;
    let ids: Vec<String> = (0..4).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    // The same view (id 2) delivered twice is counted once; "pricing" is refused.
    for (i, path) in [0, 1, 2, 2, 3]
        .into_iter()
        .zip(["/", "/pricing", "/", "/", "pricing"])
    {
        let value = format!(r#"{{"path":"{path}"}}"#);
        let id = rdkafka::message::Header {
            key: "id",
            value: Some(&ids[i]),
        };
        let record = FutureRecord::to(&topic).key(path).payload(&value);
        let sent = producer.send(
            record.headers(OwnedHeaders::new().insert(id)),
            std::time::Duration::from_secs(10),
        );
        sent.await.map_err(|(e, _)| e)?;
    }
    let total = "SELECT coalesce(sum(views), 0)::bigint FROM page_views";
    let before: i64 = db.query_one(total, &[]).await?.get(0);
    let kafka = KafkaSettings::new(brokers, topic, "page-views");
    let config = ProcessorConfig::new(kafka).until_drained();
    let run = batch_inbox::run(config, pool.clone(), Arc::new(PageViews), pending());
    let s = run.await?.snapshot();
    println!("{s:?}");
    let list = "SELECT path, views FROM page_views ORDER BY 1";
    for row in db.query(list, &[]).await? {
        let (path, views): (String, i64) = (row.get(0), row.get(1));
        println!("{path:10} {views} views");
    }
    let after: i64 = db.query_one(total, &[]).await?.get(0);
    let totals = (s.records, s.new, s.duplicates, s.rejected);
    anyhow::ensure!(totals == (5, 4, 1, 1), "wrong totals: {totals:?}");
    anyhow::ensure!(after - before == 3, "3 views expected");
    Ok(())
}
