//! What the authority adapter adds to a Probe round trip, measured so that
//! a loaded machine's drift cancels: two identical bare tonic servers, one
//! serving its connections through `AnyAuthority`, called alternately in
//! short rounds; each round gives one paired ratio. Wall time per call is
//! what a caller waits; CPU time per call (client and server, this whole
//! process) is what the work costs, and moves far less with the load of
//! other processes. Prints figures.
//!
//! `cargo bench -p any-authority --bench authority [-- ROUNDS CALLS]`

use std::time::{Duration, Instant};

use any_authority::AnyAuthority;
use csi_client::{ClientOptions, CsiClient, Endpoint};
use csi_proto::testing::FakeIdentity;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::*;
use futures::TryStreamExt;
use tokio_stream::wrappers::UnixListenerStream;

async fn client(path: &std::path::Path) -> CsiClient {
    let endpoint = Endpoint::unix(path).unwrap();
    CsiClient::connect_when_ready(endpoint, ClientOptions::default(), Duration::from_secs(30))
        .await
        .expect("server reachable")
}

/// User + system CPU time of this process so far.
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Mean wall and CPU time, in µs, of `calls` Probes.
async fn round(client: &CsiClient, calls: u32) -> (f64, f64) {
    let mut identity = client.identity();
    let (start, cpu) = (Instant::now(), cpu_time());
    for _ in 0..calls {
        identity.probe(ProbeRequest {}).await.expect("probe");
    }
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(calls);
    (per_call(start.elapsed()), per_call(cpu_time() - cpu))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    // `cargo bench` passes `--bench`; take the first two numbers given.
    let numbers: Vec<u32> = std::env::args().filter_map(|a| a.parse().ok()).collect();
    let rounds = numbers.first().copied().unwrap_or(30);
    let calls = numbers.get(1).copied().unwrap_or(1000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plain_path = dir.path().join("plain.sock");
    let adapted_path = dir.path().join("adapted.sock");
    let (plain, adapted) = rt.block_on(async {
        let plain = UnixListenerStream::new(tokio::net::UnixListener::bind(&plain_path).unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(IdentityServer::new(FakeIdentity))
                .serve_with_incoming(plain),
        );
        let adapted =
            UnixListenerStream::new(tokio::net::UnixListener::bind(&adapted_path).unwrap())
                .map_ok(AnyAuthority::new);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(IdentityServer::new(FakeIdentity))
                .serve_with_incoming(adapted),
        );
        (client(&plain_path).await, client(&adapted_path).await)
    });
    rt.block_on(async {
        // Warm-up.
        round(&plain, calls).await;
        round(&adapted, calls).await;
        // [wall, cpu] per call for plain and adapted, and their paired ratios.
        let mut plain_t = [Vec::new(), Vec::new()];
        let mut adapted_t = [Vec::new(), Vec::new()];
        let mut ratios = [Vec::new(), Vec::new()];
        for i in 0..rounds {
            // Alternate which goes first, so neither always follows the other.
            let (p, a) = if i % 2 == 0 {
                let p = round(&plain, calls).await;
                (p, round(&adapted, calls).await)
            } else {
                let a = round(&adapted, calls).await;
                (round(&plain, calls).await, a)
            };
            for (k, (p, a)) in [(p.0, a.0), (p.1, a.1)].into_iter().enumerate() {
                plain_t[k].push(p);
                adapted_t[k].push(a);
                ratios[k].push(a / p);
            }
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "probe round trip, {rounds} paired rounds of {calls} calls (loadavg {})",
            load.trim()
        );
        for (k, what) in ["wall", "cpu"].into_iter().enumerate() {
            let (lo, hi) = (
                ratios[k].iter().cloned().fold(f64::MAX, f64::min),
                ratios[k].iter().cloned().fold(0.0, f64::max),
            );
            println!(
                "  {what:4} µs/call: plain {:.1}, with AnyAuthority {:.1}; paired ratio median {:.3} (min {lo:.3}, max {hi:.3})",
                median(&mut plain_t[k]),
                median(&mut adapted_t[k]),
                median(&mut ratios[k]),
            );
        }
    });
}
