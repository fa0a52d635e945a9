//! A real S3 server for tests (the object store's and the file system's;
//! the `s3` feature): moto (`pip install 'moto[server]'`), one per test process on a free
//! port of 127.0.0.1, stopped when the process ends (its shell wrapper
//! kills it when our end of its stdin closes). Found at
//! $ZLOGFS_MOTO_SERVER, else target/moto/bin/moto_server (test.sh makes
//! that venv), else on PATH. Test support only: it panics when the
//! server cannot be started.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "test support: a server that does not start is a failed test"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The test process's S3 server.
pub struct Moto {
    /// Its port on 127.0.0.1.
    pub port: u16,
    _child: Mutex<Child>,
}

fn server_path() -> PathBuf {
    if let Some(p) = std::env::var_os("ZLOGFS_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/moto/bin/moto_server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("moto_server")
}

/// The test process's server (started at the first call); sets the AWS_*
/// variables the store reads to point at it.
pub fn moto() -> &'static Moto {
    static M: OnceLock<Moto> = OnceLock::new();
    M.get_or_init(|| {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let bin = server_path();
        let script =
            format!("'{}' -H 127.0.0.1 -p {port} >/dev/null 2>&1 & p=$!; read _; kill $p", bin.display());
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .expect("running sh to start moto_server");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "moto_server ({}) did not start: install it with `python3 -m venv target/moto && \
                 target/moto/bin/pip install 'moto[server]'` (./test.sh does), or set ZLOGFS_MOTO_SERVER",
                bin.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Set once, before any store reads them (every test calls moto()
        // first).
        std::env::set_var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"));
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
        std::env::set_var("AWS_REGION", "us-east-1");
        Moto { port, _child: Mutex::new(child) }
    })
}

impl Moto {
    /// Make a bucket (an unsigned request: moto does not check).
    pub fn bucket(&self, name: &str) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connecting to moto");
        write!(
            s,
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .expect("sending");
        let mut reply = String::new();
        s.read_to_string(&mut reply).expect("reading");
        assert!(reply.starts_with("HTTP/1.1 200"), "creating bucket {name}: {reply}");
    }
}

/// A client of `bucket` on the test server, with a runtime to block on.
pub fn client(bucket: &str) -> (tokio::runtime::Runtime, object_store::aws::AmazonS3) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let os = object_store::aws::AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_allow_http(true)
        .build()
        .expect("an S3 client");
    (rt, os)
}

/// The objects under `prefix` of `bucket`.
pub fn objects(bucket: &str, prefix: &str) -> Vec<object_store::ObjectMeta> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let (rt, os) = client(bucket);
    let key = object_store::path::Path::from(prefix);
    rt.block_on(os.list(Some(&key)).try_collect()).expect("listing")
}

/// How many objects there are under `prefix` of `bucket`, and their bytes.
pub fn stored(bucket: &str, prefix: &str) -> (u64, u64) {
    let all = objects(bucket, prefix);
    (all.len() as u64, all.iter().map(|m| m.size).sum())
}
