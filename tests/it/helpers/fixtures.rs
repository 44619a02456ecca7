//! Payloads and certificates the tests send with.

use std::process::Command;

use super::*;

/// An `account_verification` payload for `to`.
pub fn verification(to: &str) -> serde_json::Value {
    serde_json::json!({"to": to, "name": "Ada", "verify_url": "https://app.example/verify"})
}

/// A throwaway certificate authority and a server certificate for 127.0.0.1 that it signed,
/// made with the openssl command line.
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |name: &str| dir.path().join(name);
        std::fs::write(
            path("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .expect("write extensions");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let steps: [Vec<&str>; 3] = [
            [
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=outboxd test CA",
                ],
            ]
            .concat(),
            [
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=127.0.0.1",
                ],
            ]
            .concat(),
            vec![
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        ];
        for args in steps {
            let output = Command::new("openssl")
                .args(&args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl");
            assert!(output.status.success(), "openssl {args:?}: {output:?}");
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// An SMTP server presenting this CA's certificate: STARTTLS, or `extra` flags.
    pub fn smtp_server(&self, extra: &[&str]) -> SmtpServer {
        let (cert, key) = (self.path("server.pem"), self.path("server.key"));
        let flags = [&["--tls-cert", &cert, "--tls-key", &key][..], extra].concat();
        SmtpServer::start_with(free_port(), &flags)
    }
}

/// A refusal: non-zero exit, an `error:` line, and no panic or backtrace.
pub fn assert_refused(output: &std::process::Output, expected: &str) {
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted; stderr: {err}");
    assert!(err.starts_with("error:"), "{err}");
    assert!(err.contains(expected), "{err:?} does not say {expected:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}
