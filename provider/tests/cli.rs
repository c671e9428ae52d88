//! The `dedupq-provider` binary refuses to start with settings it cannot
//! use, naming them.

use std::process::Command;

#[test]
fn a_rate_outside_zero_to_one_stops_the_simulator_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_dedupq-provider"))
        .args(["--listen", "127.0.0.1:0", "--slow-after-charge-rate", "2"])
        .output()
        .expect("run dedupq-provider");

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--slow-after-charge-rate"), "{stderr}");
}

#[test]
fn the_documented_provider_commands_exist_and_parse() {
    use clap::Parser;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/development.md"
    ))
    .expect("docs/development.md");
    let commands: Vec<&str> = text
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .flat_map(str::lines)
        .filter(|l| l.starts_with("dedupq-provider"))
        .collect();
    assert!(
        !commands.is_empty(),
        "docs/development.md shows dedupq-provider"
    );
    for line in commands {
        let words = line.split('#').next().unwrap().split_whitespace();
        dedupq_provider::Args::try_parse_from(words)
            .unwrap_or_else(|e| panic!("docs/development.md command `{line}` does not parse: {e}"));
    }
}

#[test]
fn sigterm_stops_the_simulator() {
    use std::time::{Duration, Instant};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let schema = format!("provider_sigterm_{}", std::process::id());
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedupq-provider"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--schema",
            &schema,
        ])
        .spawn()
        .expect("start dedupq-provider");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the simulator never listened"
        );
        assert!(child.try_wait().unwrap().is_none(), "the simulator exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let stopping = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if stopping.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("still running 20 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exited with {status}");
}
