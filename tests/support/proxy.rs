//! A small HTTP `CONNECT` proxy for the proxy tests.
//!
//! It listens on 127.0.0.1, logs every `CONNECT` target (and the
//! `Proxy-Authorization` it came with), can demand Basic authentication or
//! refuse with a fixed status, and otherwise tunnels bytes to the target.
//! An IP-literal target is connected to as given; a name (sent only when the
//! client lets the proxy resolve names) is taken to mean 127.0.0.1, where
//! the test origin listens.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How the proxy answers a `CONNECT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Opens the tunnel.
    Tunnel,
    /// Answers with this status and closes.
    Refuse(u16),
}

/// One `CONNECT` the proxy received.
#[derive(Clone, Debug)]
pub struct Connect {
    /// The request target, as sent (`ip:port` or `name:port`).
    pub target: String,
    /// The `Proxy-Authorization` header, if any.
    pub authorization: Option<String>,
}

#[derive(Default)]
struct State {
    log: Vec<Connect>,
    answer: Option<Answer>,
    /// When set, `CONNECT`s without exactly this header get 407.
    required: Option<String>,
}

/// A running proxy; dropping it stops accepting.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy on 127.0.0.1 with an ephemeral port that tunnels
    /// every `CONNECT`.
    pub async fn start() -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve(client, Arc::clone(&shared)));
            }
        });
        Proxy {
            addr,
            state,
            accept,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://user:password@127.0.0.1:<port>`.
    pub fn url_with(&self, user: &str, password: &str) -> String {
        format!("http://{user}:{password}@{}", self.addr)
    }

    /// Demands `Proxy-Authorization: Basic base64(user:password)`.
    pub fn require_basic(&self, user: &str, password: &str) {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        self.state.lock().unwrap().required = Some(format!("Basic {token}"));
    }

    /// Answers every later `CONNECT` with `answer`.
    pub fn answer(&self, answer: Answer) {
        self.state.lock().unwrap().answer = Some(answer);
    }

    /// Every `CONNECT` so far, in order.
    pub fn log(&self) -> Vec<Connect> {
        self.state.lock().unwrap().log.clone()
    }

    /// The `CONNECT` targets so far, in order.
    pub fn targets(&self) -> Vec<String> {
        self.log().into_iter().map(|c| c.target).collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut client: TcpStream, state: Arc<Mutex<State>>) {
    let Some(head) = read_head(&mut client).await else {
        return;
    };
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "CONNECT" {
        let _ = client
            .write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            .await;
        return;
    }
    let authorization = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
        .map(|(_, v)| v.trim().to_string());
    let answer = {
        let mut s = state.lock().unwrap();
        s.log.push(Connect {
            target: target.to_string(),
            authorization: authorization.clone(),
        });
        match (&s.required, &s.answer) {
            (Some(required), _) if authorization.as_ref() != Some(required) => Answer::Refuse(407),
            (_, Some(answer)) => answer.clone(),
            _ => Answer::Tunnel,
        }
    };
    if let Answer::Refuse(status) = answer {
        let text = format!(
            "HTTP/1.1 {status} Refused\r\nProxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let _ = client.write_all(text.as_bytes()).await;
        return;
    }
    let upstream = match target.parse::<SocketAddr>() {
        Ok(addr) => TcpStream::connect(addr).await,
        Err(_) => {
            let port = target
                .rsplit(':')
                .next()
                .and_then(|p| p.parse::<u16>().ok());
            TcpStream::connect((Ipv4Addr::LOCALHOST, port.unwrap_or(443))).await
        }
    };
    let Ok(mut upstream) = upstream else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// Reads a request head (up to the blank line), one byte at a time so no
/// tunnelled byte is consumed.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return None;
        }
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    String::from_utf8(head).ok()
}
