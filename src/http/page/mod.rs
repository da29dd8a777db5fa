//! The web page at `/`: sign in with a token, the double-click demo, the owner's jobs, and a job's attempts as a
//! timeline. Plain HTML, CSS and a JavaScript module, no CDN: the files are compiled into the binary gzipped
//! (`build.rs`: a Lambda package's size is its cold start) and served gzipped to a client that takes gzip — every
//! browser — and inflated for one that does not. The page talks to the same API as every other client.

use std::io::Read;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/index.html.gz"));
const SCRIPT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/app.js.gz"));
const STYLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/style.css.gz"));

/// One page file, `gzipped`, as `asked` takes it, with the headers every page file carries: its type, no caching
/// (the binary is the version), and a policy that lets it load nothing but itself.
fn file(asked: &HeaderMap, content_type: &'static str, gzipped: &'static [u8]) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::VARY, "accept-encoding"),
    ];
    if takes_gzip(asked.get(header::ACCEPT_ENCODING)) {
        return (headers, [(header::CONTENT_ENCODING, "gzip")], gzipped).into_response();
    }
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut text)
        .expect("the build gzipped it");
    (headers, text).into_response()
}

/// Whether an `Accept-Encoding` takes gzip (and does not refuse it with `q=0`).
fn takes_gzip(accept: Option<&HeaderValue>) -> bool {
    let Some(accept) = accept.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    accept.split(',').any(|coding| {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let refused = parts.any(|p| p.replace(' ', "").eq_ignore_ascii_case("q=0"));
        (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
    })
}

pub async fn index(asked: HeaderMap) -> Response {
    file(&asked, "text/html; charset=utf-8", INDEX)
}

pub async fn script(asked: HeaderMap) -> Response {
    file(&asked, "text/javascript; charset=utf-8", SCRIPT)
}

pub async fn style(asked: HeaderMap) -> Response {
    file(&asked, "text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_sent_only_to_a_client_that_takes_it() {
        let takes = |v: &str| takes_gzip(Some(&HeaderValue::from_str(v).unwrap()));
        assert!(takes("gzip, deflate, br"));
        assert!(takes("br;q=1.0, GZIP;q=0.5"));
        assert!(takes("*"));
        assert!(!takes("identity"));
        assert!(!takes("gzip;q=0, br"));
        assert!(!takes("gzip; q=0"));
        assert!(!takes_gzip(None));
    }
}
