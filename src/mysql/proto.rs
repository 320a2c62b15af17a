//! A small client of the MySQL protocol (MySQL 8, MariaDB 10.6+): what
//! mysqlStore needs and nothing more. It connects over TCP (TLS after the
//! server's `SSLRequest`, over rustls), logs in with `mysql_native_password`
//! or `caching_sha2_password` (its full login only over TLS: the password
//! is never sent in clear, nor RSA-encrypted), and runs text queries
//! (`COM_QUERY`, several statements in one, their results read in order).
//! Nothing is kept on the session that a pooler would have to carry over.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::tls::MyTls;

const CLIENT_LONG_PASSWORD: u32 = 1;
const CLIENT_LONG_FLAG: u32 = 4;
const CLIENT_CONNECT_WITH_DB: u32 = 8;
const CLIENT_PROTOCOL_41: u32 = 0x200;
const CLIENT_SSL: u32 = 0x800;
const CLIENT_TRANSACTIONS: u32 = 0x2000;
const CLIENT_SECURE_CONNECTION: u32 = 0x8000;
const CLIENT_MULTI_STATEMENTS: u32 = 0x1_0000;
const CLIENT_MULTI_RESULTS: u32 = 0x2_0000;
const CLIENT_PLUGIN_AUTH: u32 = 0x8_0000;
const CLIENT_PLUGIN_AUTH_LENENC: u32 = 0x20_0000;
const SERVER_MORE_RESULTS_EXISTS: u16 = 0x0008;
/// utf8mb4_general_ci: both servers know it.
const CHARSET: u8 = 45;
const MAX_PACKET: usize = 0xff_ffff;

/// A failure of the protocol client.
#[derive(Debug)]
pub enum MyFailure {
    /// The connection failed (refused, reset, closed, a TLS error).
    Io(String),
    /// The server answered with an error packet.
    Server {
        code: u16,
        state: String,
        message: String,
    },
    /// The login can't go on (an unsupported plugin, a password that would go in clear).
    Login(String),
    /// The server sent something this client does not understand.
    Protocol(&'static str),
}

impl From<io::Error> for MyFailure {
    fn from(e: io::Error) -> MyFailure {
        MyFailure::Io(e.to_string())
    }
}

pub type Res<T> = std::result::Result<T, MyFailure>;

enum MyStream {
    Plain(TcpStream),
    MyTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for MyStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MyStream::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            MyStream::MyTls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MyStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            MyStream::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            MyStream::MyTls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MyStream::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            MyStream::MyTls(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            MyStream::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            MyStream::MyTls(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct Login {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: Option<String>,
}

/// How TLS is used.
#[derive(Clone)]
pub enum TlsUse {
    /// Never.
    Off,
    /// When the server offers it (`ssl-mode=PREFERRED`).
    Prefer(MyTls),
    /// Always; a server without TLS is refused.
    Require(MyTls),
}

/// One result of a query's statements, in order.
#[derive(Debug, PartialEq)]
pub enum StatementResult {
    /// An OK packet: the rows a statement changed.
    Done { affected: u64 },
    /// A result set: its rows, each column as text (None: NULL).
    Rows(Vec<Vec<Option<String>>>),
}

/// An open connection.
pub struct MyConn {
    stream: tokio::io::BufStream<MyStream>,
    seq: u8,
    /// The server's id of the connection (for `KILL QUERY`).
    pub thread_id: u32,
    pub tls: bool,
    buf: Vec<u8>,
}

fn lenenc(data: &[u8], at: &mut usize) -> Res<u64> {
    let first = *data.get(*at).ok_or(MyFailure::Protocol("a short packet"))?;
    *at += 1;
    let size = match first {
        0..=0xfa => return Ok(u64::from(first)),
        0xfc => 2,
        0xfd => 3,
        0xfe => 8,
        _ => return Err(MyFailure::Protocol("a bad length")),
    };
    let bytes = data
        .get(*at..*at + size)
        .ok_or(MyFailure::Protocol("a short packet"))?;
    *at += size;
    let mut n = [0u8; 8];
    n[..size].copy_from_slice(bytes);
    Ok(u64::from_le_bytes(n))
}

fn server_error(packet: &[u8]) -> MyFailure {
    // 0xff, code (2), '#', state (5), message.
    let code = packet
        .get(1..3)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .unwrap_or(0);
    let (state, message) = match packet.get(3) {
        Some(b'#') if packet.len() >= 9 => (
            String::from_utf8_lossy(&packet[4..9]).into_owned(),
            String::from_utf8_lossy(&packet[9..]).into_owned(),
        ),
        _ => (
            "HY000".into(),
            String::from_utf8_lossy(packet.get(3..).unwrap_or(&[])).into_owned(),
        ),
    };
    MyFailure::Server {
        code,
        state,
        message,
    }
}

fn sha1(parts: &[&[u8]]) -> [u8; 20] {
    let mut h = sha1_smol::Sha1::new();
    for p in parts {
        h.update(p);
    }
    h.digest().bytes()
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut c = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        c.update(p);
    }
    let mut out = [0; 32];
    out.copy_from_slice(c.finish().as_ref());
    out
}

/// The login answer of `plugin` to `scramble`.
fn scramble_for(plugin: &str, password: &[u8], scramble: &[u8]) -> Res<Vec<u8>> {
    if password.is_empty() {
        return Ok(Vec::new());
    }
    match plugin {
        "mysql_native_password" => {
            let one = sha1(&[password]);
            let two = sha1(&[&one]);
            let mix = sha1(&[scramble, &two]);
            Ok(one.iter().zip(mix).map(|(a, b)| a ^ b).collect())
        }
        "caching_sha2_password" => {
            let one = sha256(&[password]);
            let two = sha256(&[&one]);
            let mix = sha256(&[&two, scramble]);
            Ok(one.iter().zip(mix).map(|(a, b)| a ^ b).collect())
        }
        _ => Err(MyFailure::Login(format!(
            "the server asks for the {plugin} login, which mysqlStore does not speak \
             (use mysql_native_password or caching_sha2_password)"
        ))),
    }
}

impl MyConn {
    async fn read_packet(&mut self) -> Res<Vec<u8>> {
        let mut payload = Vec::new();
        loop {
            let mut head = [0u8; 4];
            self.stream.read_exact(&mut head).await?;
            let len = usize::from(head[0]) | usize::from(head[1]) << 8 | usize::from(head[2]) << 16;
            self.seq = head[3].wrapping_add(1);
            let start = payload.len();
            payload.resize(start + len, 0);
            self.stream.read_exact(&mut payload[start..]).await?;
            if len < MAX_PACKET {
                return Ok(payload);
            }
        }
    }

    /// Queues one packet (split as the protocol asks: a payload of a
    /// multiple of 2^24 - 1 bytes ends with an empty one); `flush` sends.
    async fn write_packet(&mut self, payload: &[u8]) -> Res<()> {
        let mut rest = payload;
        loop {
            let take = rest.len().min(MAX_PACKET);
            let len = take as u32;
            let head = [len as u8, (len >> 8) as u8, (len >> 16) as u8, self.seq];
            self.seq = self.seq.wrapping_add(1);
            self.stream.write_all(&head).await?;
            self.stream.write_all(&rest[..take]).await?;
            rest = &rest[take..];
            if take < MAX_PACKET {
                return Ok(());
            }
        }
    }

    /// Connects and logs in.
    pub async fn connect(target: &Login, tls: &TlsUse) -> Res<MyConn> {
        let tcp = TcpStream::connect((target.host.as_str(), target.port)).await?;
        let _ = tcp.set_nodelay(true);
        let mut conn = MyConn {
            stream: tokio::io::BufStream::new(MyStream::Plain(tcp)),
            seq: 0,
            thread_id: 0,
            tls: false,
            buf: Vec::new(),
        };
        let hello = conn.read_packet().await?;
        if hello.first() == Some(&0xff) {
            return Err(server_error(&hello));
        }
        if hello.first() != Some(&10) {
            return Err(MyFailure::Protocol("not a MySQL server (handshake v10)"));
        }
        let mut at = 1;
        let end = hello[at..]
            .iter()
            .position(|&b| b == 0)
            .ok_or(MyFailure::Protocol("a bad handshake"))?;
        at += end + 1;
        let fixed = hello
            .get(at..at + 4 + 8 + 1 + 2 + 1 + 2 + 2 + 1 + 10)
            .ok_or(MyFailure::Protocol("a short handshake"))?;
        let thread_id = u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
        let mut scramble = fixed[4..12].to_vec();
        let caps = u32::from(u16::from_le_bytes([fixed[13], fixed[14]]))
            | u32::from(u16::from_le_bytes([fixed[18], fixed[19]])) << 16;
        let data_len = usize::from(fixed[20]);
        at += fixed.len();
        if caps & CLIENT_SECURE_CONNECTION != 0 {
            let more = data_len.saturating_sub(8).max(13);
            let part = hello
                .get(at..at + more)
                .ok_or(MyFailure::Protocol("a short handshake"))?;
            // The part ends with a NUL that is not the scramble's.
            scramble.extend_from_slice(&part[..more - 1]);
            at += more;
        }
        let mut plugin = "mysql_native_password".to_string();
        if caps & CLIENT_PLUGIN_AUTH != 0 {
            if let Some(rest) = hello.get(at..) {
                let name = rest.split(|&b| b == 0).next().unwrap_or(&[]);
                if !name.is_empty() {
                    plugin = String::from_utf8_lossy(name).into_owned();
                }
            }
        }
        if caps & CLIENT_PROTOCOL_41 == 0 {
            return Err(MyFailure::Protocol("the server is older than MySQL 4.1"));
        }
        let mut flags = CLIENT_LONG_PASSWORD
            | CLIENT_LONG_FLAG
            | CLIENT_PROTOCOL_41
            | CLIENT_TRANSACTIONS
            | CLIENT_SECURE_CONNECTION
            | CLIENT_MULTI_STATEMENTS
            | CLIENT_MULTI_RESULTS
            | CLIENT_PLUGIN_AUTH
            | CLIENT_PLUGIN_AUTH_LENENC;
        if target.database.is_some() {
            flags |= CLIENT_CONNECT_WITH_DB;
        }
        let offered = caps & CLIENT_SSL != 0;
        let tls_config = match tls {
            TlsUse::Off => None,
            TlsUse::Prefer(t) => offered.then_some(t),
            TlsUse::Require(t) if offered => Some(t),
            TlsUse::Require(_) => {
                return Err(MyFailure::Login(
                    "the server does not offer TLS, which ssl-mode asks for".into(),
                ))
            }
        };
        let mut head = Vec::with_capacity(64);
        if let Some(t) = tls_config {
            flags |= CLIENT_SSL;
            head.extend_from_slice(&flags.to_le_bytes());
            head.extend_from_slice(&(MAX_PACKET as u32).to_le_bytes());
            head.push(CHARSET);
            head.extend_from_slice(&[0; 23]);
            conn.write_packet(&head).await?;
            conn.stream.flush().await?;
            let seq = conn.seq;
            let MyStream::Plain(tcp) = conn.stream.into_inner() else {
                return Err(MyFailure::Protocol("TLS twice"));
            };
            let tls = t.connect(&target.host, tcp).await?;
            conn = MyConn {
                stream: tokio::io::BufStream::new(MyStream::MyTls(Box::new(tls))),
                seq,
                thread_id: 0,
                tls: true,
                buf: Vec::new(),
            };
        } else {
            head.extend_from_slice(&flags.to_le_bytes());
            head.extend_from_slice(&(MAX_PACKET as u32).to_le_bytes());
            head.push(CHARSET);
            head.extend_from_slice(&[0; 23]);
        }
        let password = target.password.as_bytes();
        let answer = scramble_for(&plugin, password, &scramble)?;
        let mut login = head;
        login.extend_from_slice(target.user.as_bytes());
        login.push(0);
        login.push(answer.len() as u8);
        login.extend_from_slice(&answer);
        if let Some(db) = &target.database {
            login.extend_from_slice(db.as_bytes());
            login.push(0);
        }
        login.extend_from_slice(plugin.as_bytes());
        login.push(0);
        conn.write_packet(&login).await?;
        conn.stream.flush().await?;
        conn.thread_id = thread_id;
        conn.finish_login(plugin, scramble, password).await?;
        Ok(conn)
    }

    async fn finish_login(
        &mut self,
        mut plugin: String,
        mut scramble: Vec<u8>,
        password: &[u8],
    ) -> Res<()> {
        for _ in 0..4 {
            let packet = self.read_packet().await?;
            match packet.first() {
                Some(0x00) => return Ok(()),
                Some(0xff) => return Err(server_error(&packet)),
                Some(0xfe) => {
                    // An auth switch: the plugin's name, then its scramble.
                    let rest = &packet[1..];
                    let name_end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
                    plugin = String::from_utf8_lossy(&rest[..name_end]).into_owned();
                    let mut data = rest.get(name_end + 1..).unwrap_or(&[]).to_vec();
                    if data.last() == Some(&0) {
                        data.pop();
                    }
                    scramble = data;
                    let answer = scramble_for(&plugin, password, &scramble)?;
                    self.write_packet(&answer).await?;
                    self.stream.flush().await?;
                }
                Some(0x01) if plugin == "caching_sha2_password" => match packet.get(1) {
                    // The fast login succeeded: an OK packet follows.
                    Some(3) => {}
                    Some(4) => {
                        if !self.tls {
                            return Err(MyFailure::Login(
                                "the server asks caching_sha2_password's full login, which sends the password: \
                                 mysqlStore sends it only over TLS (use ssl-mode=REQUIRED or better, or log in \
                                 once with another client so that the server caches the password)"
                                    .into(),
                            ));
                        }
                        let mut clear = password.to_vec();
                        clear.push(0);
                        self.write_packet(&clear).await?;
                        self.stream.flush().await?;
                    }
                    _ => return Err(MyFailure::Protocol("an unknown caching_sha2_password step")),
                },
                _ => return Err(MyFailure::Protocol("an unknown login answer")),
            }
        }
        let _ = scramble;
        Err(MyFailure::Protocol("the login did not end"))
    }

    /// Whether an idle connection is known to be gone: the server closed it
    /// (a restart, `KILL`, `wait_timeout`) or sent something unasked (its
    /// error packet before closing). Looks without reading or waiting.
    pub fn is_dead(&self) -> bool {
        let (tcp, tls) = match self.stream.get_ref() {
            MyStream::Plain(tcp) => (tcp, false),
            MyStream::MyTls(s) => (s.get_ref().0, true),
        };
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match tcp.poll_peek(&mut cx, &mut buf) {
            std::task::Poll::Pending => false,
            // Over TLS, a record the server sends unasked (a session ticket) is no sign.
            std::task::Poll::Ready(Ok(n)) => n == 0 || !tls,
            std::task::Poll::Ready(Err(_)) => true,
        }
    }

    /// Runs `sql` (one or more statements, `;` between them) and reads
    /// every result: the replies of the statements that ran, in order, and
    /// the error that stopped the rest, if one did.
    pub async fn query(&mut self, sql: &str) -> Res<(Vec<StatementResult>, Option<MyFailure>)> {
        self.seq = 0;
        let mut packet = std::mem::take(&mut self.buf);
        packet.clear();
        packet.push(0x03);
        packet.extend_from_slice(sql.as_bytes());
        let written = self.write_packet(&packet).await;
        self.buf = packet;
        written?;
        self.stream.flush().await?;
        self.read_replies().await
    }

    async fn read_replies(&mut self) -> Res<(Vec<StatementResult>, Option<MyFailure>)> {
        let mut replies = Vec::new();
        loop {
            let first = self.read_packet().await?;
            match first.first() {
                Some(0x00) => {
                    let mut at = 1;
                    let affected = lenenc(&first, &mut at)?;
                    let _insert_id = lenenc(&first, &mut at)?;
                    let status = first
                        .get(at..at + 2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .unwrap_or(0);
                    replies.push(StatementResult::Done { affected });
                    if status & SERVER_MORE_RESULTS_EXISTS == 0 {
                        return Ok((replies, None));
                    }
                }
                Some(0xff) => return Ok((replies, Some(server_error(&first)))),
                Some(0xfb) => return Err(MyFailure::Protocol("LOCAL INFILE is not supported")),
                _ => {
                    let mut at = 0;
                    let columns = lenenc(&first, &mut at)? as usize;
                    for _ in 0..columns {
                        self.read_packet().await?;
                    }
                    let eof = self.read_packet().await?;
                    if eof.first() != Some(&0xfe) {
                        return Err(MyFailure::Protocol("no EOF after the columns"));
                    }
                    let mut rows = Vec::new();
                    let status = loop {
                        let row = self.read_packet().await?;
                        if row.first() == Some(&0xfe) && row.len() < 9 {
                            break row
                                .get(3..5)
                                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                                .unwrap_or(0);
                        }
                        if row.first() == Some(&0xff) {
                            return Ok((replies, Some(server_error(&row))));
                        }
                        let mut at = 0;
                        let mut values = Vec::with_capacity(columns);
                        for _ in 0..columns {
                            if row.get(at) == Some(&0xfb) {
                                at += 1;
                                values.push(None);
                                continue;
                            }
                            let len = lenenc(&row, &mut at)? as usize;
                            let text = row
                                .get(at..at + len)
                                .ok_or(MyFailure::Protocol("a short row"))?;
                            at += len;
                            values.push(Some(String::from_utf8_lossy(text).into_owned()));
                        }
                        rows.push(values);
                    };
                    replies.push(StatementResult::Rows(rows));
                    if status & SERVER_MORE_RESULTS_EXISTS == 0 {
                        return Ok((replies, None));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_password_scramble_matches_the_known_answer() {
        // SHA1(pw) XOR SHA1(scramble + SHA1(SHA1(pw))): empty passwords send nothing.
        assert!(scramble_for("mysql_native_password", b"", b"x")
            .unwrap()
            .is_empty());
        let a = scramble_for("mysql_native_password", b"secret", &[7; 20]).unwrap();
        let b = scramble_for("mysql_native_password", b"secret", &[8; 20]).unwrap();
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
        assert_eq!(
            scramble_for("caching_sha2_password", b"secret", &[7; 20])
                .unwrap()
                .len(),
            32
        );
        assert!(matches!(
            scramble_for("client_ed25519", b"pw", &[0; 32]),
            Err(MyFailure::Login(_))
        ));
    }

    #[test]
    fn lengths_are_read_in_every_width() {
        let data = [
            0xfa, 0xfc, 1, 2, 0xfd, 1, 2, 3, 0xfe, 1, 0, 0, 0, 0, 0, 0, 0,
        ];
        let mut at = 0;
        assert_eq!(lenenc(&data, &mut at).unwrap(), 0xfa);
        assert_eq!(lenenc(&data, &mut at).unwrap(), 0x0201);
        assert_eq!(lenenc(&data, &mut at).unwrap(), 0x030201);
        assert_eq!(lenenc(&data, &mut at).unwrap(), 1);
        assert!(lenenc(&data, &mut at).is_err());
    }
}
