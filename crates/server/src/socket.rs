//! A connection's socket halves, plain TCP or TLS, behind one type so the
//! connection code reads and writes without knowing which. An enum rather
//! than a boxed trait object keeps the plain path free of dynamic dispatch
//! and of the lock `tokio::io::split` puts between the halves.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The read half of a connection.
pub enum ReadStream {
    Tcp(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<TcpStream>>),
}

impl ReadStream {
    /// Whether the connection is TLS (AMQPS).
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls(_))
    }
}

/// The write half of a connection.
pub enum WriteStream {
    Tcp(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<TcpStream>>),
}

impl WriteStream {
    /// A second handle to a plain TCP socket (shared, so non-blocking like
    /// this one), for writes from outside the runtime; `None` for TLS,
    /// whose bytes only the TLS stream may write, or when the process is
    /// out of file descriptors.
    pub fn second_plain_handle(&self) -> Option<std::net::TcpStream> {
        use std::os::fd::AsFd;
        match self {
            Self::Tcp(w) => {
                let stream: &TcpStream = w.as_ref();
                stream
                    .as_fd()
                    .try_clone_to_owned()
                    .map(std::net::TcpStream::from)
                    .ok()
            }
            Self::Tls(_) => None,
        }
    }
}

/// Splits a plain TCP connection.
pub fn plain(s: TcpStream) -> (ReadStream, WriteStream) {
    let (r, w) = s.into_split();
    (ReadStream::Tcp(r), WriteStream::Tcp(w))
}

/// Splits a TLS connection.
pub fn tls(s: TlsStream<TcpStream>) -> (ReadStream, WriteStream) {
    let (r, w) = tokio::io::split(s);
    (ReadStream::Tls(r), WriteStream::Tls(w))
}

impl AsyncRead for ReadStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            Self::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            Self::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            Self::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(w) => w.is_write_vectored(),
            Self::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(w) => Pin::new(w).poll_flush(cx),
            Self::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            Self::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection's output goes out with one `writev` per buffer of
    /// frames and shared bodies (`pending_output.rs`); a write half that does not
    /// forward vectored writes sends each piece with a syscall of its own
    /// (seen: 28 times the `sendto`s, a quarter of the drain rate lost).
    #[test]
    fn the_plain_write_half_writes_vectored() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
            let (_r, w) = plain(client.expect("connect"));
            drop(accepted);
            assert!(w.is_write_vectored());
        });
    }
}
