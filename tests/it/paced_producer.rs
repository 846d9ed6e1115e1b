//! The load generator's paced producer: every record's acknowledgement is measured, and the
//! warm-up record that readies the producer before the clock starts goes to a side topic, never
//! into the run's input.

use crate::common::broker::Broker;
use crate::common::group::OffsetReader;
use batch_inbox_tools::generate::{generate, GeneratorSettings};
use batch_inbox_tools::produce;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_run_measures_every_acknowledgement_and_keeps_its_warm_up_apart() {
    let broker = Broker::start();
    let topic = broker.topic("paced");
    produce::ensure_topic(&broker.addr, &topic, 4)
        .await
        .unwrap();
    let (records, _) = generate(GeneratorSettings {
        messages: 300,
        accounts: 50,
        ..GeneratorSettings::default()
    });
    let producer = produce::producer(&broker.addr, &[]).unwrap();
    produce::warm_up(&broker.addr, &producer, &topic)
        .await
        .unwrap();
    let sent = produce::send_paced(&producer, &topic, records, Some(1000.0), |_| {})
        .await
        .unwrap();
    assert_eq!(sent.delivered, 300);
    assert_eq!(
        sent.acked_ms.count, 300,
        "one acknowledgement time per record"
    );
    assert!(sent.acked_ms.p50 >= 1.0 && sent.acked_ms.p50 <= sent.acked_ms.max);
    // The run's topic holds exactly the run's records; the warm-up record is in its side topic.
    let run = OffsetReader::new(&broker.addr, "paced-check", &topic, 4);
    assert_eq!(run.ends().iter().sum::<i64>(), 300);
    let side = OffsetReader::new(&broker.addr, "paced-check", &format!("{topic}-warmup"), 1);
    assert_eq!(side.ends(), vec![1]);
}
