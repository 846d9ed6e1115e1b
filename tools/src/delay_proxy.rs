//! A TCP proxy that delays every byte by a fixed time in each direction: a database on another
//! host, for the load test's remote-database profile (`delay-proxy --listen … --target … --delay-ms
//! 0.5`). A round trip through it costs twice the delay more than a direct one, whatever the
//! traffic: bytes are timestamped when read and written out once their time has come, so the
//! delay adds latency without limiting throughput, and order is kept.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// `delay-proxy` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DelayProxyArgs {
    /// Address to listen on, e.g. 127.0.0.1:6432.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where to forward connections, e.g. 127.0.0.1:5432.
    #[arg(long)]
    pub target: SocketAddr,
    /// Delay added in each direction, in milliseconds (fractions allowed).
    #[arg(long)]
    pub delay_ms: f64,
}

/// Serves until the process is stopped.
pub async fn serve(args: DelayProxyArgs) -> anyhow::Result<()> {
    let delay = Duration::from_secs_f64(args.delay_ms.max(0.0) / 1000.0);
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "delaying {} -> {} by {:.3} ms each way",
        args.listen, args.target, args.delay_ms
    );
    loop {
        let (client, _) = listener.accept().await?;
        let target = args.target;
        tokio::spawn(async move {
            if let Err(e) = connect(client, target, delay).await {
                tracing::debug!("proxied connection ended: {e}");
            }
        });
    }
}

async fn connect(client: TcpStream, target: SocketAddr, delay: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(target).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(forward(cr, sw, delay));
    let down = tokio::spawn(forward(sr, cw, delay));
    let _ = tokio::join!(up, down);
    Ok(())
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
async fn forward(
    mut from: impl AsyncReadExt + Unpin + Send + 'static,
    mut to: impl AsyncWriteExt + Unpin + Send + 'static,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_round_trip_pays_the_delay_twice_and_bytes_keep_their_order() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
        });
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = proxy.local_addr().unwrap();
        let delay = Duration::from_millis(50);
        tokio::spawn(async move {
            let (client, _) = proxy.accept().await.unwrap();
            connect(client, target, delay).await.unwrap();
        });
        let mut c = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        c.write_all(b"one").await.unwrap();
        c.write_all(b"two").await.unwrap();
        let mut got = Vec::new();
        while got.len() < 6 {
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"onetwo");
        assert!(started.elapsed() >= 2 * delay, "{:?}", started.elapsed());
    }
}
