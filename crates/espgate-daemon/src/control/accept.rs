//! The accept loop both control-thread servers share (the control socket
//! and the metrics endpoint): at most `max` clients at once, each served
//! by its own task, until the stop.

use std::future::Future;
use std::io;
use std::sync::Arc;
use tokio::sync::{watch, Semaphore};

/// A listener the loop accepts from.
pub(super) trait Listener {
    type Stream: Send + 'static;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Stream>>;
}

impl Listener for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> io::Result<Self::Stream> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Listener for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<Self::Stream> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Accepts from `listener` until `stop` changes, handing each client to
/// `serve` in a task of its own. The loop waits for room before it
/// accepts, so clients past `max` wait in the kernel's listen backlog
/// rather than in memory. A failed accept (a client that reset before we
/// took it, a full file table) is logged as `what` and the loop goes on.
pub(super) async fn accept_loop<L, F, Fut>(
    listener: L,
    what: &'static str,
    max: usize,
    mut stop: watch::Receiver<bool>,
    mut serve: F,
) where
    L: Listener,
    F: FnMut(L::Stream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let room = Arc::new(Semaphore::new(max));
    loop {
        let permit = tokio::select! {
            p = room.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("{what} accept: {e}");
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let client = serve(stream);
        tokio::spawn(async move {
            let _permit = permit;
            client.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// With room for two, a third client waits until one of the first two
    /// is done; the stop ends the loop.
    #[test]
    fn clients_past_the_limit_wait_and_the_stop_ends_the_loop() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop_tx, stop_rx) = watch::channel(false);
            let started = Arc::new(AtomicUsize::new(0));
            let seen = started.clone();
            // Each client is served by echoing one byte after reading one.
            let server = tokio::spawn(accept_loop(listener, "test", 2, stop_rx, move |mut s| {
                seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).await.is_ok() {
                        let _ = s.write_all(&b).await;
                    }
                }
            }));
            let mut c1 = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _c2 = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut c3 = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(started.load(Ordering::SeqCst), 2, "only two served at once");

            // The first finishes; the third gets its turn.
            c1.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            c1.read_exact(&mut b).await.unwrap();
            c3.write_all(b"y").await.unwrap();
            tokio::time::timeout(Duration::from_secs(5), c3.read_exact(&mut b))
                .await
                .expect("the third client is served once there is room")
                .unwrap();
            assert_eq!(&b, b"y");
            assert_eq!(started.load(Ordering::SeqCst), 3);

            stop_tx.send(true).unwrap();
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .expect("the stop ends the loop")
                .unwrap();
        });
    }
}
