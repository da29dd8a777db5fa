//! The web page at `/`: sign in with a token, the double-click demo, the owner's jobs, and a job's attempts as a
//! timeline. Plain HTML, CSS and a JavaScript module, no build step and no CDN: the files are compiled into the
//! binary and served as they are. The page talks to the same API as every other client.

use axum::http::header;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

/// The headers every page file carries: its type, no caching (the binary is the version), and a policy that lets
/// it load nothing but itself.
fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
}

pub async fn index() -> impl IntoResponse {
    file("text/html; charset=utf-8", INDEX)
}

pub async fn script() -> impl IntoResponse {
    file("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style() -> impl IntoResponse {
    file("text/css; charset=utf-8", STYLE)
}
