//! The web page's files (`src/http/page/`), gzipped at build time: the binary carries them compressed (a Lambda
//! package's size is its cold start), and the page is served as the browser takes it.

use std::io::Write;
use std::path::Path;

fn main() {
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    for file in ["index.html", "app.js", "style.css"] {
        let path = format!("src/http/page/{file}");
        println!("cargo::rerun-if-changed={path}");
        let text = std::fs::read(&path).expect("a page file");
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gzip.write_all(&text).expect("gzip in memory");
        let packed = gzip.finish().expect("gzip in memory");
        std::fs::write(Path::new(&out).join(format!("{file}.gz")), packed)
            .expect("OUT_DIR is writable");
    }
}
