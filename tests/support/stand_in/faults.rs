//! Servers that misbehave at the wire: one that hangs up, resets after reading, cuts an answer mid-body, or refuses
//! connections.

use super::*;

/// A server that reads each request and closes the connection without a word: the request was sent, no answer
/// will come. Returns its base URL.
pub(crate) async fn hanging_up() -> String {
    reading_then_closing(false).await
}

/// A server that reads each request and resets the connection (TCP RST) instead of answering. Returns its base URL.
pub(crate) async fn resetting() -> String {
    reading_then_closing(true).await
}

async fn reading_then_closing(reset: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = socket.read(&mut buf).await;
            if reset {
                // Linger 0: closing sends a reset, not a FIN.
                let _ = socket.set_zero_linger();
            }
            drop(socket);
        }
    });
    format!("http://{addr}/v1")
}

/// A server that reads each request and answers `200 OK` with a JSON body it cuts off halfway: the status line and
/// the headers (a `Content-Length` of the whole body) go out, half the body follows, then the connection closes —
/// the work was done and its answer was lost on the way. Returns its base URL.
pub(crate) async fn cutting() -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = json!({"output": {"message": {"role": "assistant", "content": []}}, "choices": [], "content": []})
        .to_string();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = socket.read(&mut buf).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&body.as_bytes()[..body.len() / 2]).await;
            let _ = socket.flush().await;
            drop(socket);
        }
    });
    format!("http://{addr}/v1")
}

/// A base URL on which nothing listens: connections are refused before anything is sent.
pub(crate) async fn refusing() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}
