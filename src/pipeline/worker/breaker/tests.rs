//! The breaker's parsing, and its decisions at a high and a low rate (tokio's paused clock).

use super::*;

fn limit(s: &str) -> PoisonLimit {
    parse_poison_limit(s).unwrap().unwrap()
}

#[test]
fn limits_parse_and_print() {
    assert_eq!(limit("50%/100,min=20"), PoisonLimit::DEFAULT);
    assert_eq!(limit("50%/100"), PoisonLimit::DEFAULT);
    assert_eq!(PoisonLimit::DEFAULT.to_string(), "50%/100,min=20");
    let l = limit(" 10%/1000 , min=5 ");
    assert_eq!(
        (l.share.percent, l.share.window, l.floor.count),
        (10, 1000, 5)
    );
    assert_eq!(l.to_string(), "10%/1000,min=5");
    assert_eq!(parse_poison_limit("off"), Ok(None));
    assert_eq!(
        parse_max_poison_rate("50%/100,min=7"),
        Ok(Some(PoisonRate::floor(7)))
    );
    for bad in [
        "",
        "20",
        "0/1m",
        "x/1m",
        "20/0s",
        "20/1y",
        "-1/1m",
        "100%/100",
        "50%/1",
        "50%/100,min=0",
        "50%/100,min=100",
        "50%/100,20",
        "50%",
        "20/1m,min=3",
        "x%/100",
    ] {
        assert!(parse_poison_limit(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_old_count_per_duration_form_is_the_floor() {
    assert_eq!(
        parse_max_poison_rate("20/1m"),
        Ok(Some(PoisonRate::DEFAULT))
    );
    let r = parse_max_poison_rate("5/10s").unwrap().unwrap();
    assert_eq!((r.count, r.per), (5, Duration::from_secs(10)));
    assert_eq!(r.to_string(), "5/10s");
    assert_eq!(PoisonRate::DEFAULT.to_string(), "20/1m");
    let l = limit("5/10s");
    assert_eq!((l.share, l.floor.count), (PoisonShare::DEFAULT, 5));
    assert_eq!(limit("20/1m"), PoisonLimit::DEFAULT);
    assert_eq!(
        limit("300/1m").share.window,
        600,
        "widened so that it can trip"
    );
}

/// Runs `messages` through a breaker as a worker does (true: the message fails alone),
/// at one message per `every` of tokio's paused clock; returns how many were dead-lettered
/// and the index of the message it tripped on.
async fn run(breaker: &mut Breaker, messages: &[bool], every: Duration) -> (usize, Option<usize>) {
    let mut dead_lettered = 0;
    for (i, &fails) in messages.iter().enumerate() {
        tokio::time::sleep(every).await;
        match fails {
            false => breaker.applied(1),
            true if breaker.trips() => return (dead_lettered, Some(i)),
            true => dead_lettered += 1,
        }
    }
    (dead_lettered, None)
}

/// One bad message in a hundred, at offsets 37, 137, 237, …
fn one_percent(n: usize) -> Vec<bool> {
    (0..n).map(|i| i % 100 == 37).collect()
}

const FAST: Duration = Duration::from_micros(10); // 100,000 messages/s
const SLOW: Duration = Duration::from_secs(5); // one message every 5 s

#[tokio::test(start_paused = true)]
async fn one_percent_bad_data_is_dead_lettered_and_flows_at_any_rate() {
    for every in [FAST, SLOW] {
        let mut b = Breaker::new(Some(PoisonRate::DEFAULT), PoisonShare::DEFAULT);
        assert_eq!(
            run(&mut b, &one_percent(20_000), every).await,
            (200, None),
            "{every:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_deployment_that_fails_every_message_stalls_after_the_floor_at_any_rate() {
    for every in [FAST, SLOW] {
        let mut b = Breaker::new(Some(PoisonRate::DEFAULT), PoisonShare::DEFAULT);
        assert_eq!(
            run(&mut b, &[true; 1000], every).await,
            (20, Some(20)),
            "{every:?}"
        );
        // After a long healthy run too: the share of the window decides.
        let mut b = Breaker::new(Some(PoisonRate::DEFAULT), PoisonShare::DEFAULT);
        let mut stream = vec![false; 10_000];
        stream.extend([true; 1000]);
        assert_eq!(
            run(&mut b, &stream, every).await,
            (50, Some(10_050)),
            "{every:?}"
        );
    }
}

#[test]
fn a_batch_that_commits_counts_as_that_many_applied_messages() {
    let mut b = Breaker::new(
        Some(PoisonRate::floor(2)),
        PoisonShare::new(50, 10).unwrap(),
    );
    assert!(
        !b.trips() && !b.trips(),
        "the floor: two dead letters first"
    );
    b.applied(1_000);
    for n in 1..=5 {
        assert!(
            !b.trips(),
            "{n} of the last 10: the floor, then not more than half"
        );
    }
    assert!(b.trips(), "6 of the last 10");
}

#[test]
fn a_fixed_cause_resets_the_breaker() {
    let mut b = Breaker::new(Some(PoisonRate::floor(3)), PoisonShare::DEFAULT);
    assert!(!b.trips() && !b.trips() && !b.trips());
    assert!(b.trips(), "a fourth failure of four");
    b.reset();
    assert!(!b.trips() && !b.trips() && !b.trips(), "the floor again");
}

#[test]
fn off_never_trips() {
    let mut b = Breaker::new(None, PoisonShare::DEFAULT);
    assert!((0..10_000).all(|_| !b.trips()));
}
