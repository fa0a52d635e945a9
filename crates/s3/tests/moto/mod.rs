//! A real S3 server for the tests: moto (`pip install 'moto[server]'`),
//! one per test process on a free port of 127.0.0.1, stopped when the
//! process ends (its shell wrapper kills it when our end of its stdin
//! closes). Found at $ZLOGFS_MOTO_SERVER, else target/moto/bin/moto_server
//! (test.sh makes that venv), else on PATH.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

pub struct Moto {
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

    /// An object's bytes, or None when missing.
    pub fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let (rt, os) = client(bucket);
        rt.block_on(async { os.get(&Key::from(key)).await.ok()?.bytes().await.ok() }).map(|b| b.to_vec())
    }

    /// Upload an object as is, overwriting.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        let (rt, os) = client(bucket);
        rt.block_on(os.put(&Key::from(key), PutPayload::from(data.to_vec()))).expect("uploading");
    }
}

fn client(bucket: &str) -> (tokio::runtime::Runtime, object_store::aws::AmazonS3) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let os = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_allow_http(true)
        .build()
        .expect("an S3 client");
    (rt, os)
}

/// crates/s3/tests/proxy.py in front of the server: counts requests and
/// injects faults. Stopped when the process ends (as the server).
pub struct Proxy {
    pub port: u16,
    _child: Child,
}

impl Proxy {
    pub fn start(seed: u64) -> Proxy {
        let target = moto().port;
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/proxy.py");
        let sh = format!(
            "python3 '{}' {port} {target} {seed} >/dev/null 2>&1 & p=$!; read _; kill $p",
            script.display()
        );
        let child = Command::new("sh").args(["-c", &sh]).stdin(Stdio::piped()).spawn().expect("running sh");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "the proxy did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Proxy { port, _child: child }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// GET a control path; the counts as JSON text.
    pub fn control(&self, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connecting to the proxy");
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("sending");
        let mut reply = String::new();
        s.read_to_string(&mut reply).expect("reading");
        reply.split("\r\n\r\n").nth(1).unwrap_or_default().to_string()
    }

    /// One count from the proxy's figures.
    pub fn count(&self, what: &str) -> u64 {
        let stats = self.control("/__stats");
        let at = stats.find(&format!("\"{what}\": ")).expect("a count the proxy keeps");
        stats[at + what.len() + 4..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .expect("a number")
    }
}
