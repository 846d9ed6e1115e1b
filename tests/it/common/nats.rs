//! A private NATS server with JetStream per test (its own port, file store and password), killed
//! and started again on the same store by the tests that need it, and a small client speaking
//! the NATS protocol itself over TCP: streams and consumers made through the JetStream API,
//! messages published with any header bytes (what a client library refuses to send) and their
//! acknowledgements awaited, many in flight. Used as `common::nats`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batch_inbox_tools::generate::Record;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::child::Finished;

/// The user the server accepts.
pub const USER: &str = "app";

/// The shortest `duplicate_window` JetStream accepts. Within it the server itself drops a message
/// whose `Nats-Msg-Id` it saw; the tests' streams take the shortest, so that the duplicates of
/// the input reach the processor's inbox (as a publisher's retry after the window would), and
/// [`Client::publish_records`] sends a message the server dropped again once it has passed.
pub const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);

/// Publishes in flight at once (a chunk is written, then its acknowledgements are read).
const IN_FLIGHT: usize = 1_000;

/// The longest wait for one answer of the server.
const ANSWER: Duration = Duration::from_secs(30);

/// A `nats-server` (`NATS_SERVER`, else from PATH) with JetStream on a file store in a
/// temporary directory, and a password of its own; stopped and removed on drop.
pub struct NatsServer {
    dir: PathBuf,
    pub port: u16,
    password: String,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl NatsServer {
    /// Writes the configuration (port, store, user and password) and starts the server; returns
    /// once JetStream answers.
    pub async fn start() -> NatsServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("bi-nats-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("store")).expect("temp dir");
        let password = format!("Nt{}", uuid::Uuid::new_v4().simple());
        let config = format!(
            "listen: 127.0.0.1:{port}\n\
             server_name: bi_test_{port}\n\
             jetstream {{ store_dir: \"{}\" }}\n\
             authorization {{ user: {USER}, password: \"{password}\" }}\n",
            dir.join("store").display()
        );
        std::fs::write(dir.join("nats.conf"), config).expect("config written");
        let mut server = NatsServer {
            dir,
            port,
            password,
            child: None,
        };
        server.start_again().await;
        server
    }

    /// Starts the server (again) on its port and store, and waits until JetStream answers (at
    /// most 30 s): a stream on the store is recovered by then.
    pub async fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server runs already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("server log");
        let bin = std::env::var("NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned());
        let child = Command::new(&bin)
            .arg("-c")
            .arg(self.dir.join("nats.conf"))
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut client) = self.try_client().await {
                if client.try_request("$JS.API.INFO", b"").await.is_ok() {
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("nats-server exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "JetStream did not answer: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the server (SIGKILL: no shutdown, nothing flushed that was not yet) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `nats://app:<password>@127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.url_with_password(&self.password)
    }

    /// The server's URL with another password.
    pub fn url_with_password(&self, password: &str) -> String {
        format!("nats://{USER}:{password}@127.0.0.1:{}", self.port)
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// A client logged in as the processor is.
    pub async fn client(&self) -> Client {
        self.try_client()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to nats-server: {e}"))
    }

    async fn try_client(&self) -> Result<Client, String> {
        Client::connect(self.port, USER, &self.password).await
    }

    /// Panics unless a process's whole output is free of the server's password.
    #[track_caller]
    pub fn assert_no_secret(&self, out: &Finished) {
        for (name, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            assert!(
                !text.contains(&self.password),
                "the password in {name}: {text}"
            );
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One message to publish: `headers` is the whole header block as sent (`NATS/1.0\r\n…\r\n\r\n`,
/// any bytes: see [`header_block`]), `None` for a message without headers (`PUB`).
#[derive(Debug, Clone)]
pub struct Publish {
    pub subject: String,
    pub headers: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

/// A header block of `lines` exactly as given (each without its CRLF): a line may be any bytes,
/// `name: value` or not.
pub fn header_block(lines: &[&[u8]]) -> Vec<u8> {
    let mut block = b"NATS/1.0\r\n".to_vec();
    for line in lines {
        block.extend_from_slice(line);
        block.extend_from_slice(b"\r\n");
    }
    block.extend_from_slice(b"\r\n");
    block
}

/// The `Nats-Msg-Id` header line of `id` (any bytes).
pub fn id_line(id: &[u8]) -> Vec<u8> {
    [b"Nats-Msg-Id: ".as_slice(), id].concat()
}

/// A generated ledger record as a service publishes it: to `<prefix>.<account>` (one subject per
/// account; the stream keeps the order of all), its id in `Nats-Msg-Id` (no header at all for a
/// record without one), its value as the payload (empty for a record without one).
pub fn ledger_message(prefix: &str, record: &Record) -> Publish {
    Publish {
        subject: format!("{prefix}.{}", record.key),
        headers: record
            .id
            .as_deref()
            .map(|id| header_block(&[&id_line(id.as_bytes())])),
        payload: record.value.clone().unwrap_or_default(),
    }
}

/// The records as published, except that every record with the generator's one invalid id
/// (`not-a-uuid`) gets an invalid id of its own (`not-a-uuid-<n>`): the server would drop all
/// but one of them within its duplicate window, and any text that is no UUID is dead-lettered
/// the same (`invalid_id`), so the model's outcome does not change.
pub fn distinct_invalid_ids(records: &[Record]) -> Vec<Record> {
    let mut n = 0;
    records
        .iter()
        .map(|r| match r.id.as_deref() {
            Some(id) if uuid::Uuid::try_parse(id.trim()).is_err() => {
                n += 1;
                Record {
                    id: Some(format!("{id}-{n}")),
                    ..r.clone()
                }
            }
            _ => r.clone(),
        })
        .collect()
}

/// What JetStream says of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerInfo {
    /// Messages of the filter not yet delivered.
    pub num_pending: u64,
    /// Delivered and not yet acknowledged.
    pub num_ack_pending: u64,
    /// Of those, delivered more than once.
    pub num_redelivered: u64,
    /// The stream sequence below which everything is acknowledged.
    pub ack_floor: u64,
    /// The last stream sequence delivered.
    pub delivered: u64,
    /// The consumer's configuration as the server holds it.
    pub config: Value,
}

/// A message the server sent: its subject, header block and payload.
struct Msg {
    subject: String,
    headers: Vec<u8>,
    payload: Vec<u8>,
}

/// A NATS connection of the tests' own (TCP, the text protocol), with one subscription: its
/// reply inbox.
pub struct Client {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    inbox: String,
    requests: u64,
}

fn parse_u64(field: Option<&str>, line: &str) -> usize {
    field
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("a size in {line:?}"))
}

impl Client {
    /// Connects and logs in; `Err` with the server's word when it refuses.
    pub async fn connect(port: u16, user: &str, password: &str) -> Result<Client, String> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (read, writer) = stream.into_split();
        let mut client = Client {
            reader: BufReader::new(read),
            writer,
            inbox: format!("_INBOX.{}", uuid::Uuid::new_v4().simple()),
            requests: 0,
        };
        let info = client.line().await?;
        if !info.starts_with("INFO ") {
            return Err(format!("not a NATS server: {info}"));
        }
        let connect = json!({
            "verbose": false,
            "pedantic": false,
            "headers": true,
            "no_responders": true,
            "protocol": 1,
            "user": user,
            "pass": password,
        });
        let hello = format!("CONNECT {connect}\r\nPING\r\nSUB {}.* 1\r\n", client.inbox);
        client.write(hello.as_bytes()).await?;
        loop {
            let line = client.line().await?;
            match line.as_str() {
                "PONG" => return Ok(client),
                "+OK" => {}
                l if l.starts_with("INFO ") => {}
                other => return Err(other.to_owned()),
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.writer
            .write_all(bytes)
            .await
            .map_err(|e| e.to_string())
    }

    /// The next protocol line, without its CRLF.
    async fn line(&mut self) -> Result<String, String> {
        let mut line = Vec::new();
        let read = tokio::time::timeout(ANSWER, self.reader.read_until(b'\n', &mut line)).await;
        match read {
            Err(_) => Err("no answer from the server".to_owned()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(0)) => Err("the server closed the connection".to_owned()),
            Ok(Ok(_)) => {
                while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    line.pop();
                }
                Ok(String::from_utf8_lossy(&line).into_owned())
            }
        }
    }

    /// The next message, answering the server's pings meanwhile.
    async fn next_msg(&mut self) -> Result<Msg, String> {
        loop {
            let line = self.line().await?;
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (subject, header_len, total) = match fields.first().copied().unwrap_or_default() {
                "PING" => {
                    self.write(b"PONG\r\n").await?;
                    continue;
                }
                "PONG" | "+OK" | "INFO" => continue,
                "MSG" => (fields[1], 0, parse_u64(fields.last().copied(), &line)),
                "HMSG" => {
                    let n = fields.len();
                    (
                        fields[1],
                        parse_u64(fields.get(n - 2).copied(), &line),
                        parse_u64(fields.last().copied(), &line),
                    )
                }
                _ => return Err(line),
            };
            let subject = subject.to_owned();
            let mut body = vec![0u8; total + 2];
            tokio::time::timeout(ANSWER, self.reader.read_exact(&mut body))
                .await
                .map_err(|_| "a message cut short".to_owned())?
                .map_err(|e| e.to_string())?;
            body.truncate(total);
            let payload = body.split_off(header_len);
            return Ok(Msg {
                subject,
                headers: body,
                payload,
            });
        }
    }

    /// `PUB` or `HPUB` of `m` with reply subject `reply`, appended to `out`.
    fn encode(out: &mut Vec<u8>, m: &Publish, reply: &str) {
        match &m.headers {
            None => {
                out.extend_from_slice(
                    format!("PUB {} {reply} {}\r\n", m.subject, m.payload.len()).as_bytes(),
                );
            }
            Some(h) => {
                let total = h.len() + m.payload.len();
                out.extend_from_slice(
                    format!("HPUB {} {reply} {} {total}\r\n", m.subject, h.len()).as_bytes(),
                );
                out.extend_from_slice(h);
            }
        }
        out.extend_from_slice(&m.payload);
        out.extend_from_slice(b"\r\n");
    }

    /// A request and its JSON answer; `Err` when nobody answers (no responders: JetStream not
    /// ready) or the answer is no JSON.
    pub async fn try_request(&mut self, subject: &str, payload: &[u8]) -> Result<Value, String> {
        self.requests += 1;
        let reply = format!("{}.r{}", self.inbox, self.requests);
        let mut out = Vec::new();
        let m = Publish {
            subject: subject.to_owned(),
            headers: None,
            payload: payload.to_vec(),
        };
        Self::encode(&mut out, &m, &reply);
        self.write(&out).await?;
        loop {
            let msg = self.next_msg().await?;
            if msg.subject != reply {
                continue; // a late answer of an earlier request
            }
            if msg.headers.starts_with(b"NATS/1.0 503") {
                return Err(format!("no responders on {subject}"));
            }
            return serde_json::from_slice(&msg.payload).map_err(|e| {
                format!(
                    "{e}: {subject} answered {}",
                    String::from_utf8_lossy(&msg.payload)
                )
            });
        }
    }

    /// A JetStream API request whose answer must be no error.
    pub async fn api(&mut self, subject: &str, body: &Value) -> Value {
        let answer = self
            .try_request(subject, body.to_string().as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        assert!(answer.get("error").is_none(), "{subject}: {answer}");
        answer
    }

    /// Creates stream `name` on `subjects`, on the file store, with the shortest duplicate
    /// window, and `extra` settings.
    pub async fn create_stream(&mut self, name: &str, subjects: &[&str], extra: Value) {
        let mut config = json!({
            "name": name,
            "subjects": subjects,
            "storage": "file",
            "duplicate_window": DUPLICATE_WINDOW.as_nanos() as u64,
        });
        if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
            c.extend(e.clone());
        }
        self.api(&format!("$JS.API.STREAM.CREATE.{name}"), &config)
            .await;
    }

    /// Stream `name`'s state: `messages`, `first_seq`, `last_seq`, ….
    pub async fn stream_state(&mut self, name: &str) -> Value {
        let info = self
            .api(&format!("$JS.API.STREAM.INFO.{name}"), &json!({}))
            .await;
        info["state"].clone()
    }

    /// Creates durable consumer `name` on `stream` with `config` (the settings besides the name);
    /// returns the server's answer, an error included.
    pub async fn create_consumer(&mut self, stream: &str, name: &str, config: Value) -> Value {
        let mut config = config;
        config["durable_name"] = json!(name);
        let body = json!({ "stream_name": stream, "config": config });
        self.try_request(
            &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{name}"),
            body.to_string().as_bytes(),
        )
        .await
        .unwrap_or_else(|e| panic!("consumer {name}: {e}"))
    }

    /// What JetStream says of `stream`'s consumer `name`; `None` when it does not exist.
    pub async fn consumer_info(&mut self, stream: &str, name: &str) -> Option<ConsumerInfo> {
        let subject = format!("$JS.API.CONSUMER.INFO.{stream}.{name}");
        let info = self
            .try_request(&subject, b"")
            .await
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        if info["error"]["code"] == json!(404) {
            return None;
        }
        assert!(info.get("error").is_none(), "{subject}: {info}");
        let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("{subject}: {info}"));
        Some(ConsumerInfo {
            num_pending: n(&info["num_pending"]),
            num_ack_pending: n(&info["num_ack_pending"]),
            num_redelivered: n(&info["num_redelivered"]),
            ack_floor: n(&info["ack_floor"]["stream_seq"]),
            delivered: n(&info["delivered"]["stream_seq"]),
            config: info["config"].clone(),
        })
    }

    /// Publishes `messages` to JetStream, up to [`IN_FLIGHT`] awaiting their acknowledgement at
    /// once, and returns each one's answer (`{"stream", "seq"[, "duplicate"]}` or an error), in
    /// the order given.
    pub async fn publish_all(&mut self, messages: &[Publish]) -> Vec<Value> {
        let mut answers = vec![Value::Null; messages.len()];
        for (chunk, part) in messages.chunks(IN_FLIGHT).enumerate() {
            self.requests += 1;
            let prefix = format!("{}.p{}_", self.inbox, self.requests);
            let mut out = Vec::new();
            for (i, m) in part.iter().enumerate() {
                Self::encode(&mut out, m, &format!("{prefix}{i}"));
            }
            self.write(&out)
                .await
                .unwrap_or_else(|e| panic!("publishing: {e}"));
            let mut left = part.len();
            while left > 0 {
                let msg = self
                    .next_msg()
                    .await
                    .unwrap_or_else(|e| panic!("awaiting acknowledgements: {e}"));
                let Some(i) = msg
                    .subject
                    .strip_prefix(&prefix)
                    .and_then(|i| i.parse::<usize>().ok())
                else {
                    continue;
                };
                let at = chunk * IN_FLIGHT + i;
                assert!(answers[at].is_null(), "two answers to publish {at}");
                answers[at] = if msg.headers.starts_with(b"NATS/1.0 503") {
                    json!({"error": "no responders: no stream on this subject"})
                } else {
                    serde_json::from_slice(&msg.payload).unwrap_or_else(|e| {
                        panic!("{e}: {}", String::from_utf8_lossy(&msg.payload))
                    })
                };
                left -= 1;
            }
        }
        answers
    }

    /// Publishes `messages` so that each one is stored by the stream, in the order given except
    /// the ones the server dropped as duplicates (the same `Nats-Msg-Id` within its window):
    /// those are sent again, after the window has passed, until stored (at most 30 s). Returns
    /// each message's stream sequence.
    pub async fn publish_stored(&mut self, messages: &[Publish]) -> Vec<u64> {
        let mut seqs = vec![0u64; messages.len()];
        let mut todo: Vec<usize> = (0..messages.len()).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !todo.is_empty() {
            let batch: Vec<Publish> = todo.iter().map(|i| messages[*i].clone()).collect();
            let answers = self.publish_all(&batch).await;
            let mut again = Vec::new();
            for (i, answer) in todo.iter().zip(&answers) {
                assert!(answer.get("error").is_none(), "publish {i}: {answer}");
                if answer["duplicate"] == json!(true) {
                    again.push(*i);
                } else {
                    seqs[*i] = answer["seq"].as_u64().expect("a stream sequence");
                }
            }
            todo = again;
            if !todo.is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "{} messages still dropped as duplicates",
                    todo.len()
                );
                // The ids were last stored less than a window ago: sent again once it passed.
                tokio::time::sleep(DUPLICATE_WINDOW * 2).await;
            }
        }
        seqs
    }

    /// Publishes ledger records (see [`ledger_message`]) under subject prefix `prefix`, each one
    /// stored; returns their stream sequences.
    pub async fn publish_records(&mut self, prefix: &str, records: &[Record]) -> Vec<u64> {
        let messages: Vec<Publish> = records.iter().map(|r| ledger_message(prefix, r)).collect();
        self.publish_stored(&messages).await
    }
}
