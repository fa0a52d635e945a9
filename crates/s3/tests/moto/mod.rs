//! Helpers around the test server (crates/s3/src/testing.rs): objects
//! read and written behind the store's back, and a fault-injecting proxy.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};
use zlogfs_testkit::s3::client;
pub use zlogfs_testkit::s3::moto;

/// An object's bytes, or None when missing.
pub fn object(bucket: &str, key: &str) -> Option<Vec<u8>> {
    let (rt, os) = client(bucket);
    rt.block_on(async { os.get(&Key::from(key)).await.ok()?.bytes().await.ok() }).map(|b| b.to_vec())
}

/// Upload an object as is, overwriting.
pub fn put(bucket: &str, key: &str, data: &[u8]) {
    let (rt, os) = client(bucket);
    rt.block_on(os.put(&Key::from(key), PutPayload::from(data.to_vec()))).expect("uploading");
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
