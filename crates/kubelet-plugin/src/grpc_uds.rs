//! gRPC over Unix sockets for clients that send the socket path as HTTP/2 `:authority`.
//!
//! The kubelet dials plugin sockets with the path as its gRPC target, so its requests carry
//! `:authority: /var/lib/kubelet/plugins_registry/...sock`. The HTTP/2 server under tonic rejects
//! such a value (a path is not a valid authority) and resets the stream with PROTOCOL_ERROR. This
//! module sits between the socket and the server: it decodes each request header block, replaces
//! an authority that is not a valid one by `localhost`, and re-encodes the block. Every other
//! frame, and everything the server sends, passes through unchanged.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::UnixListener;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may use; re-encoded blocks are split to fit it.
const MAX_FRAME: usize = 16_384;
/// Header blocks larger than this are refused (the kubelet's are a few hundred bytes).
const MAX_BLOCK: usize = 1 << 20;

/// One accepted connection, as the gRPC server sees it.
#[derive(Debug)]
pub struct Connection(DuplexStream);

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

/// Accepted connections of `listener`, each behind the authority fix, for
/// `Server::serve_with_incoming`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<Connection>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(socket, _)| {
            let (server_side, proxy_side) = tokio::io::duplex(64 * 1024);
            tokio::spawn(relay(socket, proxy_side));
            Connection(server_side)
        });
        Some((next, listener))
    })
}

/// Shuttles bytes between the client socket and the server: client frames through [`rewrite`],
/// server frames as they are.
async fn relay(socket: tokio::net::UnixStream, server: DuplexStream) {
    let (client_rx, mut client_tx) = socket.into_split();
    let (mut server_rx, server_tx) = tokio::io::split(server);
    let to_server = rewrite(client_rx, server_tx);
    let to_client = async {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        let _ = client_tx.shutdown().await;
    };
    let (result, ()) = tokio::join!(to_server, to_client);
    if let Err(e) = result {
        tracing::debug!(error = %e, "gRPC connection closed");
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

/// Whether `value` is an authority the HTTP/2 server accepts.
fn valid_authority(value: &[u8]) -> bool {
    !value.is_empty() && http::uri::Authority::try_from(value).is_ok()
}

/// Copies an HTTP/2 client stream from `input` to `output`, re-encoding header blocks with an
/// invalid `:authority` replaced by `localhost`. Ends when `input` ends.
pub async fn rewrite<R, W>(mut input: R, mut output: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    input.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(invalid("not an HTTP/2 connection preface"));
    }
    output.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    // A header block in progress: (stream id, END_STREAM of its HEADERS frame, fragments so far).
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match input.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return output.shutdown().await,
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        input.read_exact(&mut payload).await?;

        let fragment = match (kind, pending.is_some()) {
            (HEADERS, false) => {
                let fragment = header_fragment(&payload, flags)?;
                pending = Some((stream, flags & END_STREAM, fragment.to_vec()));
                true
            }
            (CONTINUATION, true) => {
                let (_, _, block) = pending.as_mut().expect("checked");
                block.extend_from_slice(&payload);
                true
            }
            (_, true) => return Err(invalid("frame interleaved in a header block")),
            _ => false,
        };
        if !fragment {
            output.write_all(&head).await?;
            output.write_all(&payload).await?;
            continue;
        }
        if pending
            .as_ref()
            .is_some_and(|(_, _, b)| b.len() > MAX_BLOCK)
        {
            return Err(invalid("header block too large"));
        }
        if flags & END_HEADERS == 0 {
            continue;
        }
        let (stream, end_stream, block) = pending.take().expect("a block is pending");
        let headers = decoder
            .decode(&block)
            .map_err(|e| invalid(&format!("HPACK: {e:?}")))?;
        let fixed: Vec<(Vec<u8>, Vec<u8>)> = headers
            .into_iter()
            .map(|(name, value)| match name.as_slice() {
                b":authority" if !valid_authority(&value) => (name, b"localhost".to_vec()),
                _ => (name, value),
            })
            .collect();
        let encoded = encoder.encode(fixed.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        write_header_block(&mut output, stream, end_stream, &encoded).await?;
    }
}

/// The header block fragment of a HEADERS frame payload, without padding and priority fields.
fn header_fragment(payload: &[u8], flags: u8) -> io::Result<&[u8]> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or_else(|| invalid("short padded HEADERS"))?;
        pad = usize::from(n);
        body = rest;
    }
    if flags & PRIORITY != 0 {
        body = body
            .get(5..)
            .ok_or_else(|| invalid("short HEADERS priority"))?;
    }
    body.get(
        ..body
            .len()
            .checked_sub(pad)
            .ok_or_else(|| invalid("padding longer than HEADERS"))?,
    )
    .ok_or_else(|| invalid("bad HEADERS padding"))
}

/// Writes `block` as one HEADERS frame and as many CONTINUATION frames as it needs.
async fn write_header_block<W: AsyncWrite + Unpin>(
    out: &mut W,
    stream: u32,
    end_stream: u8,
    block: &[u8],
) -> io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![&[][..]]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let mut flags = if i == last { END_HEADERS } else { 0 };
        if i == 0 {
            flags |= end_stream;
        }
        let len = chunk.len();
        let mut head = [0u8; 9];
        head[..3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        head[3] = kind;
        head[4] = flags;
        head[5..].copy_from_slice(&stream.to_be_bytes());
        out.write_all(&head).await?;
        out.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// Splits an output stream into (type, flags, stream, payload) frames.
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= 9 {
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
            bytes = &bytes[9 + len..];
        }
        out
    }

    #[tokio::test]
    async fn socket_path_authority_becomes_localhost_and_other_frames_pass() {
        let mut client = Encoder::new();
        let request = |path: &str, authority: &str, client: &mut Encoder| {
            client.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":scheme", b"http"),
                (b":path", path.as_bytes()),
                (b":authority", authority.as_bytes()),
                (b"content-type", b"application/grpc"),
            ])
        };
        let socket = "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
        let first = request(
            "/pluginregistration.Registration/GetInfo",
            socket,
            &mut client,
        );
        // The second request reuses the client's dynamic table entries.
        let second = request(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            socket,
            &mut client,
        );
        let (a, b) = first.split_at(first.len() / 2);
        let mut padded = vec![3u8];
        padded.extend([0, 0, 0, 0, 16]); // priority: dependency 0, weight 16
        padded.extend(a);
        padded.extend([0, 0, 0]);

        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(HEADERS, PADDED | PRIORITY, 1, &padded));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x0, END_STREAM, 1, b"\0\0\0\0\0")); // DATA
        input.extend(frame(HEADERS, END_HEADERS | END_STREAM, 3, &second));

        let mut output = Vec::new();
        rewrite(&input[..], &mut output).await.unwrap();
        assert_eq!(&output[..24], PREFACE);
        let got = frames(&output[24..]);
        assert_eq!(got.len(), 4);
        assert_eq!((got[0].0, got[0].3.len()), (0x4, 0), "SETTINGS passes");
        assert_eq!(
            got[2],
            (0x0, END_STREAM, 1, b"\0\0\0\0\0".to_vec()),
            "DATA passes"
        );
        let mut server = Decoder::new();
        for (i, path) in [(1, "GetInfo"), (3, "NotifyRegistrationStatus")] {
            let (kind, flags, stream, block) = &got[i];
            assert_eq!((*kind, *stream), (HEADERS, if i == 1 { 1 } else { 3 }));
            assert_eq!(flags & END_HEADERS, END_HEADERS);
            assert_eq!(flags & END_STREAM, if i == 1 { 0 } else { END_STREAM });
            let headers = server.decode(block).unwrap();
            let get = |name: &[u8]| {
                headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(get(b":authority"), Some(b"localhost".to_vec()));
            assert!(
                String::from_utf8(get(b":path").unwrap())
                    .unwrap()
                    .ends_with(path)
            );
            assert_eq!(get(b"content-type"), Some(b"application/grpc".to_vec()));
        }
    }

    #[tokio::test]
    async fn valid_authorities_are_kept_and_garbage_is_refused() {
        let block = Encoder::new().encode([(&b":authority"[..], &b"localhost:50051"[..])]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let mut output = Vec::new();
        rewrite(&input[..], &mut output).await.unwrap();
        let got = frames(&output[24..]);
        let headers = Decoder::new().decode(&got[0].3).unwrap();
        assert_eq!(headers[0].1, b"localhost:50051");

        let mut out = Vec::new();
        assert!(
            rewrite(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &mut out)
                .await
                .is_err()
        );
        let mut bad = PREFACE.to_vec();
        bad.extend(frame(HEADERS, PADDED | END_HEADERS, 1, &[200, 1, 2]));
        assert!(
            rewrite(&bad[..], &mut Vec::new()).await.is_err(),
            "padding longer than the frame"
        );
    }
}
