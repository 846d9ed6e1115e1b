//! A TCP proxy to PostgreSQL that can stop forwarding and resume: a network that black-holes a
//! connection. The proxy keeps accepting and acknowledging what the client sends (as a proxy or
//! a NAT on the path would), so neither TCP keepalives nor `TCP_USER_TIMEOUT` notice anything:
//! only the client's own deadline does.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct BlackHole {
    pub addr: SocketAddr,
    forwarding: Arc<watch::Sender<bool>>,
}

impl BlackHole {
    /// Forwards to `target` until [`BlackHole::stop_forwarding`].
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let forwarding = Arc::new(watch::channel(true).0);
        let f = forwarding.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, f) = (target.clone(), f.clone());
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::spawn(pipe(cr, sw, f.subscribe()));
                    tokio::spawn(pipe(sr, cw, f.subscribe()));
                });
            }
        });
        BlackHole { addr, forwarding }
    }

    /// A URL of database `db` through the proxy.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@{}/{db}", self.addr)
    }

    /// Holds every byte read from now on (both ways), without closing anything.
    pub fn stop_forwarding(&self) {
        self.forwarding.send_replace(false);
    }

    /// Forwards again, what was held first.
    pub fn resume(&self) {
        self.forwarding.send_replace(true);
    }
}

/// Copies `from` to `to`, holding each chunk while forwarding is off; ends (closing `to`'s
/// write side) when `from` ends.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut forwarding: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if forwarding.wait_for(|on| *on).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
