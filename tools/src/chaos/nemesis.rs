//! The nemesis: faults at random instants, chosen by a seeded RNG.
//!
//! Faults: SIGKILL a processor (restarted after a short delay), SIGSTOP one past the session
//! timeout then SIGCONT, crash-restart the database (`-m immediate`), start an extra member, stop
//! a member gracefully (SIGTERM), SIGKILL a broker node and start it again on its own log (with
//! `--broker-stop-command`/`--broker-start-command`), fail over to a replica that lags behind
//! (`--db-failover-command`: the database goes back in time under the running members); the
//! first database outage, and half the later ones, also kill a member while its batch waits for
//! the database. Invariant: every kind that can run is injected at least once
//! (the first faults are a seeded permutation of the kinds), and every random choice comes from
//! the seed, so a failing seed replays the same schedule (process timings still vary).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::members::{Cluster, State};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL a processor, restart it after a short delay.
    Kill,
    /// SIGSTOP a processor past the session timeout, then SIGCONT.
    Pause,
    /// Stop the database like a crash, start it again.
    RestartDb,
    /// Start an extra member.
    Join,
    /// SIGTERM a member: it finishes its batches and leaves the group.
    Leave,
    /// SIGKILL a broker node, start it again on its own log.
    RestartBroker,
    /// Fail over to an asynchronous replica that lags behind: the database loses its last
    /// commits, positions included.
    Failover,
}

impl Fault {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::RestartDb => "restart_db",
            Fault::Join => "join",
            Fault::Leave => "leave",
            Fault::RestartBroker => "restart_broker",
            Fault::Failover => "failover",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    /// Seconds since the run started.
    pub at_s: f64,
    /// What.
    pub fault: Fault,
    /// To whom, and for how long.
    pub detail: String,
    /// When a pause ended (SIGCONT), in seconds since the run started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_s: Option<f64>,
    /// A failover's: the promoted database's position of each partition (partitions without
    /// one are absent), which a committed offset may move back to after `at_s`, never below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub positions: Option<BTreeMap<i32, i64>>,
}

/// How the nemesis may act.
#[derive(Debug, Clone)]
pub struct NemesisSettings {
    /// Seed of every choice.
    pub seed: u64,
    /// Shell command that stops the database like a crash (`None`: no database faults).
    pub db_stop: Option<String>,
    /// Shell command that starts it again.
    pub db_start: Option<String>,
    /// Shell command of a failover (`{group}` replaced), which prints the promoted database's
    /// positions (`None`: no failovers).
    pub db_failover: Option<String>,
    /// The group, for the failover command.
    pub group: String,
    /// The broker's nodes, numbered from 1, and the shell commands that kill one like a crash
    /// and start it again (`{node}` replaced by its number; the start returns once it serves).
    pub broker: Option<BrokerFaults>,
    /// The processors' session timeout: pauses last longer than this.
    pub session_timeout: Duration,
    /// Most members at once (joins beyond it become leaves).
    pub max_members: usize,
    /// Smallest and largest gap between two faults.
    pub gap: (Duration, Duration),
    /// NATS JetStream: the streams' locks in the database. Kills and pauses then hit a
    /// processor that holds a stream's lock two times in three (a standby's death changes
    /// nothing), and, with `pause_ends_sessions`, a pause also ends the paused processor's lock
    /// sessions, as a database that drops a silent client would, so that a standby takes its
    /// streams over while it is stopped.
    pub locks: Option<super::streams::Locks>,
    /// With `locks`: a pause ends the paused processor's lock sessions.
    pub pause_ends_sessions: bool,
}

/// How the nemesis kills and restarts broker nodes.
#[derive(Debug, Clone)]
pub struct BrokerFaults {
    /// Nodes 1..=nodes.
    pub nodes: usize,
    /// Kills node `{node}`.
    pub stop: String,
    /// Starts node `{node}` again and returns once it serves.
    pub start: String,
}

/// The fault injector.
pub struct Nemesis {
    settings: NemesisSettings,
    rng: StdRng,
    cluster: Arc<Mutex<Cluster>>,
    start: Instant,
    events: Vec<FaultEvent>,
    /// Background tasks (restarts after kills, resumes after pauses).
    pending: Vec<tokio::task::JoinHandle<()>>,
}

fn lock(c: &Mutex<Cluster>) -> std::sync::MutexGuard<'_, Cluster> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

/// Runs a shell command; its failure is returned as text.
fn shell(cmd: &str) -> Result<(), String> {
    shell_output(cmd).map(drop)
}

/// Runs a shell command and returns its standard output; its failure is returned as text.
fn shell_output(cmd: &str) -> Result<String, String> {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Nemesis {
    /// A nemesis over `cluster`; times are reported relative to `start`.
    pub fn new(settings: NemesisSettings, cluster: Arc<Mutex<Cluster>>, start: Instant) -> Self {
        Self {
            rng: StdRng::seed_from_u64(settings.seed),
            settings,
            cluster,
            start,
            events: Vec::new(),
            pending: Vec::new(),
        }
    }

    fn kinds(&self) -> Vec<Fault> {
        let mut kinds = vec![Fault::Kill, Fault::Pause, Fault::Join, Fault::Leave];
        if self.settings.db_stop.is_some() && self.settings.db_start.is_some() {
            kinds.push(Fault::RestartDb);
        }
        if self.settings.broker.is_some() {
            kinds.push(Fault::RestartBroker);
        }
        if self.settings.db_failover.is_some() {
            kinds.push(Fault::Failover);
        }
        kinds
    }

    fn pick(&mut self, kinds: &[Fault]) -> Fault {
        // Weights: kills and database restarts are what exercise recovery most.
        let weighted: Vec<Fault> = kinds
            .iter()
            .flat_map(|k| {
                let w = match k {
                    Fault::Kill | Fault::RestartDb | Fault::RestartBroker => 3,
                    Fault::Pause => 2,
                    Fault::Join | Fault::Leave | Fault::Failover => 1,
                };
                std::iter::repeat_n(*k, w)
            })
            .collect();
        weighted[self.rng.random_range(0..weighted.len())]
    }

    /// Injects faults until `until`; returns what it injected. Pauses and restarts still under
    /// way at `until` are finished before it returns.
    pub async fn run(mut self, until: Instant) -> Result<Vec<FaultEvent>, String> {
        let kinds = self.kinds();
        let mut first = kinds.clone();
        first.shuffle(&mut self.rng);
        let (lo, hi) = (
            self.settings.gap.0.as_secs_f64(),
            self.settings.gap.1.as_secs_f64(),
        );
        loop {
            let gap = secs(&mut self.rng, lo, hi.max(lo + 0.001));
            if Instant::now() + gap >= until {
                break;
            }
            tokio::time::sleep(gap).await;
            let fault = if first.is_empty() {
                self.pick(&kinds)
            } else {
                first.remove(0)
            };
            self.inject(fault).await?;
        }
        for task in self.pending.drain(..) {
            let _ = task.await;
        }
        Ok(self.events)
    }

    fn record(&mut self, fault: Fault, detail: String) {
        let at_s = self.start.elapsed().as_secs_f64();
        println!("[chaos {at_s:7.1}s] {:<10} {detail}", fault.name());
        self.events.push(FaultEvent {
            at_s,
            fault,
            detail,
            ends_s: None,
            positions: None,
        });
    }

    /// A running member chosen by the RNG, if any.
    fn running_member(&mut self) -> Option<usize> {
        let running = lock(&self.cluster).in_state(State::Running);
        running.choose(&mut self.rng).copied()
    }

    /// The member a kill or a pause hits, and its lock sessions (NATS: see
    /// [`NemesisSettings::locks`]).
    async fn target(&mut self) -> Option<(usize, Vec<super::streams::Holder>)> {
        let Some(locks) = self.settings.locks.clone() else {
            return self.running_member().map(|slot| (slot, Vec::new()));
        };
        let holders = locks.holders().await.unwrap_or_default();
        let running = lock(&self.cluster).in_state(State::Running);
        let holding: Vec<usize> = running
            .iter()
            .copied()
            .filter(|slot| holders.iter().any(|h| h.slot == Some(*slot)))
            .collect();
        let slot = if !holding.is_empty() && self.rng.random_bool(2.0 / 3.0) {
            *holding.choose(&mut self.rng)?
        } else {
            *running.choose(&mut self.rng)?
        };
        let held = holders
            .into_iter()
            .filter(|h| h.slot == Some(slot))
            .collect();
        Some((slot, held))
    }

    async fn inject(&mut self, fault: Fault) -> Result<(), String> {
        match fault {
            Fault::Kill => self.kill().await,
            Fault::Pause => self.pause().await,
            Fault::RestartDb => self.restart_db().await?,
            Fault::RestartBroker => self.restart_broker().await?,
            Fault::Failover => self.failover().await?,
            Fault::Join | Fault::Leave => self.membership(fault)?,
        }
        Ok(())
    }

    async fn kill(&mut self) {
        let Some((slot, held)) = self.target().await else {
            return;
        };
        let down = secs(&mut self.rng, 0.2, 2.0);
        lock(&self.cluster).kill(slot);
        self.record(
            Fault::Kill,
            format!(
                "member {slot} (SIGKILL){}, restart in {down:.1?}",
                holding(&held)
            ),
        );
        let cluster = self.cluster.clone();
        self.pending.push(tokio::spawn(async move {
            tokio::time::sleep(down).await;
            if let Err(e) = lock(&cluster).restart(slot) {
                eprintln!("chaos: cannot restart member {slot}: {e}");
            }
        }));
    }

    async fn pause(&mut self) {
        let Some((slot, held)) = self.target().await else {
            return;
        };
        let extra = secs(&mut self.rng, 0.5, 3.0);
        let pause = self.settings.session_timeout + extra;
        lock(&self.cluster).pause(slot);
        // NATS: the database drops the stopped processor's lock sessions, and a standby takes
        // its streams over while it is stopped.
        let ended = match &self.settings.locks {
            Some(locks) if !held.is_empty() && self.settings.pause_ends_sessions => {
                let pids: Vec<i32> = held.iter().map(|h| h.pid).collect();
                match locks.end_sessions(&pids).await {
                    Ok(n) => format!("; {n} lock sessions ended by the database"),
                    Err(e) => format!("; its lock sessions not ended: {e}"),
                }
            }
            _ => String::new(),
        };
        self.record(
            Fault::Pause,
            format!(
                "member {slot} (SIGSTOP){} for {pause:.1?}{ended}",
                holding(&held)
            ),
        );
        if let Some(e) = self.events.last_mut() {
            e.ends_s = Some(e.at_s + pause.as_secs_f64());
        }
        let cluster = self.cluster.clone();
        self.pending.push(tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            lock(&cluster).resume(slot);
        }));
    }

    async fn restart_db(&mut self) -> Result<(), String> {
        let (Some(stop), Some(start)) = (
            self.settings.db_stop.clone(),
            self.settings.db_start.clone(),
        ) else {
            return Ok(());
        };
        let down = secs(&mut self.rng, 0.5, 4.0);
        // The first outage, and half of the later ones, also kill a member once its client had
        // time to commit offsets (auto commit: every second) while its batches wait for the
        // database: a compound fault.
        let first = !self.events.iter().any(|e| e.fault == Fault::RestartDb);
        let kill_after =
            (first || self.rng.random_bool(0.5)).then(|| secs(&mut self.rng, 1.2, 2.0));
        let down = kill_after.map_or(down, |k| down.max(k + Duration::from_millis(300)));
        self.record(
            Fault::RestartDb,
            format!("immediate stop, down for {down:.1?}"),
        );
        tokio::task::spawn_blocking(move || shell(&stop))
            .await
            .map_err(|e| e.to_string())??;
        if let Some(k) = kill_after {
            tokio::time::sleep(k).await;
            self.kill().await;
            tokio::time::sleep(down - k).await;
        } else {
            tokio::time::sleep(down).await;
        }
        tokio::task::spawn_blocking(move || shell(&start))
            .await
            .map_err(|e| e.to_string())?
    }

    /// SIGKILL a broker node chosen by the RNG, leave it down for a while, start it again on its
    /// own log and wait until it serves: partition leaders move to the other nodes (a cluster) or
    /// the whole broker is away (a single node).
    async fn restart_broker(&mut self) -> Result<(), String> {
        let Some(broker) = self.settings.broker.clone() else {
            return Ok(());
        };
        let node = self.rng.random_range(1..=broker.nodes.max(1)).to_string();
        let down = secs(&mut self.rng, 0.5, 4.0);
        self.record(
            Fault::RestartBroker,
            format!(
                "node {node} of {} (SIGKILL), down for {down:.1?}",
                broker.nodes
            ),
        );
        let stop = broker.stop.replace("{node}", &node);
        let start = broker.start.replace("{node}", &node);
        tokio::task::spawn_blocking(move || shell(&stop))
            .await
            .map_err(|e| e.to_string())??;
        tokio::time::sleep(down).await;
        let began = Instant::now();
        tokio::task::spawn_blocking(move || shell(&start))
            .await
            .map_err(|e| e.to_string())??;
        let at_s = self.start.elapsed().as_secs_f64();
        println!(
            "[chaos {at_s:7.1}s] broker node {node} serves again ({:.1?} to start)",
            began.elapsed()
        );
        if let Some(e) = self.events.last_mut() {
            e.ends_s = Some(at_s);
        }
        Ok(())
    }

    /// Fails over to the replica, which lags behind by the commits of the last seconds, and
    /// records the promoted database's positions.
    async fn failover(&mut self) -> Result<(), String> {
        let Some(cmd) = self.settings.db_failover.clone() else {
            return Ok(());
        };
        self.record(
            Fault::Failover,
            "replication cut, primary killed (SIGKILL), replica promoted".to_owned(),
        );
        let cmd = cmd.replace("{group}", &self.settings.group);
        let began = Instant::now();
        let out = tokio::task::spawn_blocking(move || shell_output(&cmd))
            .await
            .map_err(|e| e.to_string())??;
        let positions = parse_positions(&out)?;
        let at_s = self.start.elapsed().as_secs_f64();
        println!(
            "[chaos {at_s:7.1}s] promoted ({:.1?}); its positions: {positions:?}",
            began.elapsed()
        );
        if let Some(e) = self.events.last_mut() {
            e.ends_s = Some(at_s);
            e.positions = Some(positions);
        }
        Ok(())
    }

    fn membership(&mut self, wanted: Fault) -> Result<(), String> {
        let active = lock(&self.cluster).active();
        let fault = match wanted {
            Fault::Join if active >= self.settings.max_members => Fault::Leave,
            Fault::Leave if active <= 1 => Fault::Join,
            f => f,
        };
        if fault == Fault::Join {
            let slot = lock(&self.cluster)
                .start_member()
                .map_err(|e| format!("cannot start a member: {e}"))?;
            self.record(Fault::Join, format!("member {slot} started"));
        } else if let Some(slot) = self.running_member() {
            lock(&self.cluster).leave(slot);
            self.record(Fault::Leave, format!("member {slot} (SIGTERM)"));
        }
        Ok(())
    }
}

/// `, holding s1, s2` for a member that holds streams' locks.
fn holding(held: &[super::streams::Holder]) -> String {
    if held.is_empty() {
        return String::new();
    }
    let streams: Vec<&str> = held.iter().map(|h| h.stream.as_str()).collect();
    format!(", holding {}", streams.join(", "))
}

/// `PARTITION NEXT_OFFSET` lines, as the failover command prints them.
fn parse_positions(out: &str) -> Result<BTreeMap<i32, i64>, String> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            match (
                w.next().and_then(|p| p.parse().ok()),
                w.next().and_then(|o| o.parse().ok()),
                w.next(),
            ) {
                (Some(p), Some(o), None) => Ok((p, o)),
                _ => Err(format!(
                    "the failover command printed {l:?}, not `PARTITION NEXT_OFFSET`"
                )),
            }
        })
        .collect()
}

/// Faults by kind name.
pub fn counts(events: &[FaultEvent]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for e in events {
        *counts.entry(e.fault.name().to_owned()).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failover_commands_positions_are_read_and_anything_else_refused() {
        let got = parse_positions("0 120\n3 7\n\n").unwrap();
        assert_eq!(got, BTreeMap::from([(0, 120), (3, 7)]));
        assert!(parse_positions("").unwrap().is_empty());
        assert!(parse_positions("0 120 9\n").is_err());
        assert!(parse_positions("zero 120\n").is_err());
    }
}
