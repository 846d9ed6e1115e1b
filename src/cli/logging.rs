//! Logs: human-readable text by default, one JSON object per line for log shippers; the summary
//! lines are the library's (`batch_inbox::Service`).

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// The AMQP client's targets, held at `info`.
const CLIENT_FRAMES: [&str; 2] = ["lapin=info", "amq_protocol=info"];

/// Installs the global subscriber: `RUST_LOG` filters (default `info,rdkafka=warn`). The AMQP
/// client's frames are never logged, whatever `RUST_LOG` says: at debug and trace it writes them
/// whole, the login's password included.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,rdkafka=warn".into())
        .add_directive(CLIENT_FRAMES[0].parse().expect("a valid directive"))
        .add_directive(CLIENT_FRAMES[1].parse().expect("a valid directive"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
