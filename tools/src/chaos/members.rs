//! The processor processes of a chaos run: `batch-inbox run` children in one consumer group, each
//! slot restarted as a new incarnation after a kill.
//!
//! Invariant: every incarnation has its own log and report file, kept after it dies, so retries,
//! assignments and counters are tallied over every process that ever ran, killed ones included.
//! A member only changes state through the nemesis (kill, pause, resume, leave) or the supervisor
//! (restart after an exit the nemesis did not cause).

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How to start a processor.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    /// The `batch-inbox` binary.
    pub bin: PathBuf,
    /// Arguments of `run`, without the per-incarnation stats file.
    pub args: Vec<String>,
    /// Environment of every member (the database URL goes here, not on the command line, where
    /// the process list would show its password).
    pub env: Vec<(String, String)>,
    /// Directory for logs and reports.
    pub work: PathBuf,
    /// Give each incarnation's database sessions an `application_name` of its own
    /// ([`super::streams::session_name`], in its `DATABASE_URL`), so that the database tells
    /// whose sessions hold the streams' locks.
    pub session_names: bool,
}

/// What a member slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Its process runs.
    Running,
    /// Its process is stopped with SIGSTOP.
    Paused,
    /// Killed; the nemesis restarts it.
    Down,
    /// Exited on its own; the supervisor restarts it.
    Exited,
    /// Asked to leave (SIGTERM) or left: not restarted.
    Left,
}

/// One member slot and its current process.
#[derive(Debug)]
struct Member {
    child: Option<Child>,
    state: State,
    incarnation: u32,
    started: Instant,
}

/// An exit the nemesis did not cause (e.g. the database was down at start-up).
#[derive(Debug, Clone, serde::Serialize)]
pub struct UnexpectedExit {
    /// Member slot.
    pub member: usize,
    /// Exit status as text.
    pub status: String,
    /// Last line of its log.
    pub last_line: String,
}

/// Every member of the group.
#[derive(Debug)]
pub struct Cluster {
    spec: MemberSpec,
    members: Vec<Member>,
    files: Vec<(PathBuf, PathBuf)>,
    /// Exits the nemesis did not cause, in order.
    pub unexpected_exits: Vec<UnexpectedExit>,
    /// Members that did not exit within the grace period of a SIGTERM.
    pub forced_kills: u64,
}

fn signal(child: &Child, sig: libc::c_int) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with the pid of a child we own and have not reaped yet.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Cluster {
    /// A group with no member yet.
    pub fn new(spec: MemberSpec) -> Self {
        Self {
            spec,
            members: Vec::new(),
            files: Vec::new(),
            unexpected_exits: Vec::new(),
            forced_kills: 0,
        }
    }

    fn spawn(&mut self, slot: usize, incarnation: u32) -> std::io::Result<Child> {
        let name = format!("member-{slot}-{incarnation}");
        let log = self.spec.work.join(format!("{name}.log"));
        let report = self.spec.work.join(format!("{name}.json"));
        let out = File::create(&log)?;
        let env = self.spec.env.iter().map(|(k, v)| match k.as_str() {
            "DATABASE_URL" if self.spec.session_names => {
                let sep = if v.contains('?') { '&' } else { '?' };
                let name = super::streams::session_name(slot, incarnation);
                (k.clone(), format!("{v}{sep}application_name={name}"))
            }
            _ => (k.clone(), v.clone()),
        });
        let child = Command::new(&self.spec.bin)
            .args(&self.spec.args)
            .arg("--stats-file")
            .arg(&report)
            .args(["--stats-interval", "250ms"])
            .envs(env)
            .env("NO_COLOR", "1")
            // CHAOS_RUST_LOG overrides the members' log filter (e.g. librdkafka=debug together
            // with `--processor-arg=-X --processor-arg=debug=fetch` to trace fetches).
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_RUST_LOG").unwrap_or_else(|_| "info,rdkafka=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        self.files.push((log, report));
        Ok(child)
    }

    /// Starts a new member; returns its slot.
    pub fn start_member(&mut self) -> std::io::Result<usize> {
        let slot = self.members.len();
        let child = self.spawn(slot, 0)?;
        self.members.push(Member {
            child: Some(child),
            state: State::Running,
            incarnation: 0,
            started: Instant::now(),
        });
        Ok(slot)
    }

    /// Slots in `state`.
    pub fn in_state(&self, state: State) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| self.members[*i].state == state)
            .collect()
    }

    /// Members that are part of the group (running or paused).
    pub fn active(&self) -> usize {
        self.members
            .iter()
            .filter(|m| matches!(m.state, State::Running | State::Paused))
            .count()
    }

    /// SIGKILL, reaped at once; the slot is down until [`Cluster::restart`].
    pub fn kill(&mut self, slot: usize) {
        let m = &mut self.members[slot];
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        m.state = State::Down;
    }

    /// Starts a new incarnation of a down slot (no-op when it is no longer down).
    pub fn restart(&mut self, slot: usize) -> std::io::Result<()> {
        if !matches!(self.members[slot].state, State::Down | State::Exited) {
            return Ok(());
        }
        let incarnation = self.members[slot].incarnation + 1;
        let child = self.spawn(slot, incarnation)?;
        let m = &mut self.members[slot];
        m.child = Some(child);
        m.incarnation = incarnation;
        m.state = State::Running;
        m.started = Instant::now();
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&mut self, slot: usize) {
        let m = &mut self.members[slot];
        if let Some(child) = &m.child {
            signal(child, libc::SIGSTOP);
            m.state = State::Paused;
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self, slot: usize) {
        let m = &mut self.members[slot];
        if let Some(child) = &m.child {
            signal(child, libc::SIGCONT);
        }
        if m.state == State::Paused {
            m.state = State::Running;
        }
    }

    /// SIGTERM: the member finishes its batches, commits and leaves the group.
    pub fn leave(&mut self, slot: usize) {
        let m = &mut self.members[slot];
        if let Some(child) = &m.child {
            signal(child, libc::SIGTERM);
        }
        m.state = State::Left;
    }

    /// Reaps members that left, and restarts running members whose process exited on its own
    /// (at most once a second per member). Call periodically.
    pub fn supervise(&mut self) {
        for slot in 0..self.members.len() {
            let status = match self.members[slot].child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => status,
                _ => continue,
            };
            let state = self.members[slot].state;
            self.members[slot].child = None;
            if state == State::Left && status.success() {
                continue;
            }
            self.unexpected_exits.push(UnexpectedExit {
                member: slot,
                status: status.to_string(),
                last_line: self.last_log_line(slot),
            });
            if state == State::Running {
                self.members[slot].state = State::Exited;
                self.members[slot].started = Instant::now();
            }
        }
        for slot in self.in_state(State::Exited) {
            if self.members[slot].started.elapsed() > Duration::from_secs(1) {
                let _ = self.restart(slot);
            }
        }
    }

    fn last_log_line(&self, slot: usize) -> String {
        let m = &self.members[slot];
        let log = self
            .spec
            .work
            .join(format!("member-{slot}-{}.log", m.incarnation));
        std::fs::read_to_string(log)
            .ok()
            .and_then(|s| s.lines().last().map(str::to_owned))
            .unwrap_or_default()
    }

    /// After the faults: resumes paused members, restarts down ones, and starts members until
    /// at least `target` are in the group.
    pub fn heal(&mut self, target: usize) -> std::io::Result<()> {
        for slot in self.in_state(State::Paused) {
            self.resume(slot);
        }
        let mut stopped = self.in_state(State::Down);
        stopped.extend(self.in_state(State::Exited));
        for slot in stopped {
            self.restart(slot)?;
        }
        while self.active() < target {
            self.start_member()?;
        }
        Ok(())
    }

    /// Children that still have a process (running, paused, or leaving).
    fn alive(&mut self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| self.members[*i].child.is_some())
            .collect()
    }

    /// SIGTERM to every member; waits `grace` for them to exit, then kills the rest.
    pub fn stop_all(&mut self, grace: Duration) {
        for slot in self.alive() {
            self.resume(slot);
            self.leave(slot);
        }
        let deadline = Instant::now() + grace;
        while !self.alive().is_empty() && Instant::now() < deadline {
            self.supervise();
            std::thread::sleep(Duration::from_millis(50));
        }
        for slot in self.alive() {
            self.forced_kills += 1;
            self.kill(slot);
            self.members[slot].state = State::Left;
        }
    }

    /// (log, report) of every incarnation that was started.
    pub fn files(&self) -> &[(PathBuf, PathBuf)] {
        &self.files
    }

    /// Members ever started (slots).
    pub fn slots(&self) -> usize {
        self.members.len()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                signal(&child, libc::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The `batch-inbox` binary: `BATCH_INBOX_BIN`, else the one beside this executable (cargo
/// builds both into the same directory).
pub(crate) fn product_bin() -> std::io::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("BATCH_INBOX_BIN") {
        return Ok(bin.into());
    }
    let me = std::env::current_exe()?;
    Ok(me.with_file_name("batch-inbox"))
}
