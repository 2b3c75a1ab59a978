//! The OCI image (`deploy/image/build.sh`), built with this test's own
//! `laned` (a debug build: what you ship is a release build) and run by
//! podman as a user runs it: the image's own command (Silero as `vad`, the
//! model from the image's cache, no pip) behind a published port, 20 pulses
//! sent by `laned client` from the host, every answer the model's alone;
//! then two containers sharing a Redis on the host: the first is stopped
//! (`podman stop`: SIGTERM, the image's stop signal) mid-stream, each stream
//! is closed 1012 at its position and resumes exactly on the second.
//!
//! Wall time, measured on a 2-core CI machine: 27 s on a fresh clone
//! (mmdebstrap's root file system from deb.debian.org, 20 to 60 s, and the
//! model's pip fetch), 9 s after (both kept in `target/image/`). Needs podman, runc and mmdebstrap (Debian's; `cargo
//! xtask test` installs them), else `SKIPPED`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use super::serve::{all_going, client_with_id, noise_pulses, solo, Going};
use super::{free_port, text};
use laned_server::testing::Redis;

/// Silero's built-in spec, as the image's own `/etc/laned/vad.toml` says it.
const SPEC: &str = "[model]\nbuiltin = \"silero\"\n";

/// A pulse of Silero: 576 `f32`.
const PULSE_BYTES: usize = 576 * 4;

/// Silero's state pair: input 2, output 1.
const PAIRS: [(usize, usize); 1] = [(2, 1)];

/// This process's hard limit of open files (`/proc/self/limits`).
fn open_files_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    line.split_whitespace().nth(4).unwrap().parse().unwrap()
}

/// What every `podman run` here is given. runc: crun refuses a host whose
/// cgroup v2 hierarchy holds controllers beside v1's ("cgroups in hybrid
/// mode not supported"), as the CI machines' do. The limits: podman asks
/// for more open files and processes than a host without CAP_SYS_RESOURCE
/// may grant ("setrlimit `RLIMIT_NOFILE`: Operation not permitted"); these
/// are within what this process has. The root file system read-only, no
/// tmpfs on it: as `readOnlyRootFilesystem` in deploy/k8s/ runs it.
fn run_flags() -> Vec<String> {
    let files = open_files_limit();
    vec![
        "--read-only".into(),
        "--read-only-tmpfs=false".into(),
        "--runtime".into(),
        "runc".into(),
        "--ulimit".into(),
        format!("nofile={files}:{files}"),
        "--ulimit".into(),
        "nproc=4096:4096".into(),
    ]
}

fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman").args(args).output().unwrap()
}

/// The image build.sh built, removed when dropped.
struct Image {
    tag: String,
}

impl Image {
    /// `build.sh TAG` with this test's binary; `None` after `SKIPPED`
    /// where podman, runc or mmdebstrap is missing.
    fn build() -> Option<Image> {
        for (tool, probe) in [
            ("podman", "--version"),
            ("runc", "--version"),
            ("mmdebstrap", "--version"),
        ] {
            let there = Command::new(tool)
                .arg(probe)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !there {
                eprintln!(
                    "SKIPPED: {tool} is not installed (Debian's `{tool}`; `cargo xtask test` installs it): the image is not built"
                );
                return None;
            }
        }
        let tag = format!("localhost/laned:test-{}", std::process::id());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/image/build.sh");
        let started = std::time::Instant::now();
        let out = Command::new("bash")
            .arg(script)
            .arg(&tag)
            .env("LANED", env!("CARGO_BIN_EXE_laned"))
            .output()
            .unwrap();
        assert!(out.status.success(), "build.sh failed: {}", text(&out));
        eprintln!("image: {tag} built in {:.1?}", started.elapsed());
        let image = Image { tag };
        let config = podman(&["image", "inspect", "--format", "{{json .Config}}", &image.tag]);
        let config: serde_json::Value = serde_json::from_slice(&config.stdout).unwrap();
        assert_eq!(config["User"], "10001:10001", "{config}");
        assert_eq!(
            config["Entrypoint"],
            serde_json::json!(["/usr/local/bin/laned", "serve"]),
            "{config}"
        );
        assert_eq!(config["StopSignal"], "SIGTERM", "{config}");
        assert!(config["ExposedPorts"].get("8080/tcp").is_some(), "{config}");
        assert!(
            config["Env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e == "LANED_CACHE_DIR=/var/cache/laned"),
            "{config}"
        );
        Some(image)
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman(&["rmi", "--force", &self.tag]);
    }
}

/// A container of the image, run in the foreground (`podman run --rm`) so
/// that its output and exit status are this child's; removed when dropped.
struct Container {
    name: String,
    child: Child,
    /// What it printed after it listened, read to its end.
    rest: Option<std::thread::JoinHandle<String>>,
}

impl Container {
    /// `podman run OPTIONS IMAGE ARGS`, waiting for `laned serve listening on`.
    fn start(image: &Image, name: &str, options: &[&str], args: &[&str]) -> Container {
        let name = format!("laned-test-{}-{name}", std::process::id());
        let mut child = Command::new("podman")
            .args(["run", "--rm", "--name", &name])
            .args(run_flags())
            .args(options)
            .arg(&image.tag)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let stderr = child.stderr.take().unwrap();
        let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let mut said = String::new();
        let mut lines = stdout.lines();
        for line in lines.by_ref() {
            let line = line.unwrap_or_default();
            said.push_str(&line);
            said.push('\n');
            if line.starts_with("laned serve listening on ") {
                let rest = std::thread::spawn(move || {
                    let mut rest: String = lines.map_while(Result::ok).map(|l| l + "\n").collect();
                    rest.push_str(&errors.join().unwrap());
                    rest
                });
                return Container {
                    name,
                    child,
                    rest: Some(rest),
                };
            }
        }
        let status = child.wait().unwrap();
        panic!(
            "container {name} ended before it listened: {status}: {said}{}",
            errors.join().unwrap()
        );
    }

    /// `podman stop -t 30`: the image's stop signal (SIGTERM), SIGKILL only
    /// past 30 s. Returns the `podman stop` process.
    fn stop(&self) -> Child {
        Command::new("podman")
            .args(["stop", "--time", "30", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The container's exit status and what it printed after listening.
    fn wait(mut self) -> (ExitStatus, String) {
        let status = self.child.wait().unwrap();
        let said = self.rest.take().unwrap().join().unwrap();
        (status, said)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--ignore", &self.name]);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `podman stop` as a user runs it, and the container's exit: 0, drained.
fn stopped(container: Container) -> String {
    let stop = container.stop().wait_with_output().unwrap();
    assert!(stop.status.success(), "podman stop: {}", text(&stop));
    let (status, said) = container.wait();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("SIGTERM: draining"), "{said}");
    said
}

/// A folder readable by the container's user (10001) holding Silero's spec.
fn spec_dir() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("vad.toml");
    std::fs::write(&spec, SPEC).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, spec)
}

/// The image as a user runs it: its own spec and models, 20 pulses by
/// `laned client`, each answer the model's alone; `podman stop` ends it
/// with 0. On the host's network (a CI machine's container network
/// backend, CNI or netavark, is not the test's to choose), the image's
/// spec on a free port.
fn the_image_serves_silero_exactly(image: &Image, spec: &Path, dir: &Path) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let command = ["vad=/etc/laned/vad.toml", "--listen", listen.as_str()];
    let container = Container::start(image, "solo", &["--network", "host"], &command);
    let pulses = noise_pulses(62, 20, PULSE_BYTES);
    let (src, dst) = (dir.join("in.raw"), dir.join("out.raw"));
    std::fs::write(&src, pulses.concat()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_laned"))
        .args(["client", &format!("ws://127.0.0.1:{port}/v1/models/vad/stream")])
        .args([&src, &dst])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "laned client: {}", text(&out));
    let got = std::fs::read(&dst).unwrap();
    let want = solo(spec, &PAIRS, &pulses);
    assert_eq!(got.len(), 20 * 4, "{}", text(&out));
    for (k, (a, w)) in got.chunks(4).zip(&want).enumerate() {
        assert_eq!(a, w.as_slice(), "answer {k} differs from the model run alone");
    }
    stopped(container);
}

/// Two containers sharing the host's Redis (host network), the spec
/// mounted: the first is stopped mid-stream; each stream with an id is
/// closed 1012 naming its position and resumes on the second from there,
/// its answers across both the model's alone.
fn a_stopped_container_hands_its_streams_over(image: &Image, spec: &Path, dir: &Path) {
    let Some(redis) = Redis::start() else { return };
    let mount = format!("{}:/specs:ro", dir.display());
    let store = redis.url();
    let replica = |name: &str| {
        let listen = format!("127.0.0.1:{}", free_port());
        let args = [
            "vad=/specs/vad.toml",
            "--listen",
            &listen,
            "--store",
            &store,
            "--drain-deadline-ms",
            "5000",
        ];
        (
            Container::start(image, name, &["--network", "host", "--volume", &mount], &args),
            listen,
        )
    };
    let (first, a) = replica("first");
    let (second, b) = replica("second");
    let streams: Vec<Vec<Vec<u8>>> = (0..4).map(|s| noise_pulses(620 + s, 200, PULSE_BYTES)).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let going = Going::default();
    let (results, stop) = runtime.block_on(async {
        let tasks: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(s, pulses)| {
                let (a, b, going, pulses) = (a.clone(), b.clone(), going.clone(), pulses.clone());
                tokio::spawn(async move {
                    let id = format!("image-{s}");
                    let url = |addr: &str| format!("ws://{addr}/v1/models/vad/stream");
                    let (hello, mut answers, closed) = client_with_id(&url(&a), &id, &pulses, &going).await;
                    assert_eq!(hello["resume"], 0, "{hello}");
                    let (code, why) = closed.expect("the stream was not handed over");
                    assert_eq!(code, 1012, "{why}");
                    assert!(why.contains(&format!("resume at chunk {}", answers.len())), "{why}");
                    let (hello, more, closed) = client_with_id(&url(&b), &id, &pulses, &going).await;
                    assert_eq!(hello["resume"].as_u64(), Some(answers.len() as u64), "{hello}");
                    assert!(closed.is_none(), "{closed:?}");
                    answers.extend(more);
                    answers
                })
            })
            .collect();
        all_going(&going, streams.len()).await;
        let stop = first.stop();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        (results, stop)
    });
    let stop = stop.wait_with_output().unwrap();
    assert!(stop.status.success(), "podman stop: {}", text(&stop));
    let (status, said) = first.wait();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("SIGTERM: draining"), "{said}");
    for (s, (pulses, answers)) in streams.iter().zip(results).enumerate() {
        let want = solo(spec, &PAIRS, pulses);
        assert_eq!(answers.len(), want.len(), "stream {s}");
        assert!(
            answers == want,
            "stream {s}: answers across the stop differ from the model alone"
        );
    }
    stopped(second);
}

#[test]
fn the_image_serves_exactly_and_hands_over_on_sigterm() {
    let Some(image) = Image::build() else { return };
    let (dir, spec) = spec_dir();
    the_image_serves_silero_exactly(&image, &spec, dir.path());
    a_stopped_container_hands_its_streams_over(&image, &spec, dir.path());
}
