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

/// SIGTERM once the simulator has said it listens ends it with status 0,
/// never by the signal's default action. The port is the one it bound to
/// `127.0.0.1:0` and read from its log: probing a port chosen beforehand
/// could reach some other process's listener and signal the simulator
/// before it set up its handlers.
#[test]
fn sigterm_stops_the_simulator() {
    use std::io::BufRead;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let schema = format!("provider_sigterm_{}", std::process::id());
    let mut child = Command::new(env!("CARGO_BIN_EXE_dedupq-provider"))
        .args(["--listen", "127.0.0.1:0", "--schema", &schema])
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dedupq-provider");
    // Every line of its log, read on a thread so that it never blocks on a
    // full pipe.
    let (lines, log) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().expect("piped stderr");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut seen = Vec::new();
    let listen = loop {
        match log.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let port = line
                    .contains("provider simulator running")
                    .then(|| line.split("listen=127.0.0.1:").nth(1))
                    .flatten()
                    .and_then(|rest| rest.split_whitespace().next())
                    .and_then(|port| port.parse::<u16>().ok());
                seen.push(line);
                if let Some(port) = port {
                    break port;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the simulator exited:\n{}", seen.join("\n"))
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the simulator never said it listens:\n{}",
            seen.join("\n")
        );
    };
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", listen)).is_ok(),
        "it listens on the port it logged"
    );
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
