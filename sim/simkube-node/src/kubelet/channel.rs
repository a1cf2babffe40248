//! The kubelet's remote-command protocol over WebSocket (`v4.channel.k8s.io`,
//! `v5.channel.k8s.io`): binary frames whose first byte names the stream, the options the API
//! server passes in the query, and the Status documents the error stream ends with.

use serde_json::{Value, json};

/// Subprotocols served, most preferred first (v5 adds the stream-close frame).
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// Stream number of the command's standard input (client to kubelet).
pub const STDIN: u8 = 0;
/// Stream number of standard output.
pub const STDOUT: u8 = 1;
/// Stream number of standard error.
pub const STDERR: u8 = 2;
/// Stream number of the final Status document.
pub const ERROR: u8 = 3;
/// Stream number of terminal size changes (client to kubelet).
pub const RESIZE: u8 = 4;
/// v5: "the client closed stream N" (payload: the stream number).
pub const CLOSE: u8 = 255;

/// A frame for `stream` carrying `data`.
pub fn frame(stream: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(stream);
    out.extend_from_slice(data);
    out
}

/// What a client frame asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFrame<'a> {
    /// Bytes for the command's stdin.
    Stdin(&'a [u8]),
    /// The client will send no more stdin (v5 only).
    StdinClosed,
    /// The terminal now has this size.
    Resize {
        /// Columns.
        width: u16,
        /// Rows.
        height: u16,
    },
    /// Nothing to act on (an empty frame, a close of another stream).
    Ignored,
}

/// Reads a binary frame from the client; an error names what was wrong with it.
pub fn parse_client_frame(data: &[u8], v5: bool) -> Result<ClientFrame<'_>, String> {
    let Some((&stream, payload)) = data.split_first() else {
        return Ok(ClientFrame::Ignored);
    };
    match stream {
        STDIN => Ok(ClientFrame::Stdin(payload)),
        RESIZE => {
            #[derive(serde::Deserialize)]
            #[serde(rename_all = "PascalCase")]
            struct Size {
                width: u16,
                height: u16,
            }
            if payload.is_empty() {
                return Ok(ClientFrame::Ignored);
            }
            let size: Size = serde_json::from_slice(payload)
                .map_err(|e| format!("invalid terminal size {:?}: {e}", lossy(payload)))?;
            Ok(ClientFrame::Resize {
                width: size.width,
                height: size.height,
            })
        }
        CLOSE if v5 => match payload.first() {
            Some(&STDIN) => Ok(ClientFrame::StdinClosed),
            _ => Ok(ClientFrame::Ignored),
        },
        other => Err(format!("unexpected stream {other} from the client")),
    }
}

fn lossy(data: &[u8]) -> String {
    String::from_utf8_lossy(&data[..data.len().min(64)]).into_owned()
}

/// The streams a session wants, from the query the API server sends (`input`, `output`,
/// `error`, `tty` set to `1`, and repeated `command`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// The command and its arguments (exec only).
    pub command: Vec<String>,
    /// The client sends stdin.
    pub stdin: bool,
    /// The client wants stdout.
    pub stdout: bool,
    /// The client wants stderr (never with a TTY, whose output is all on stdout).
    pub stderr: bool,
    /// Run under a terminal.
    pub tty: bool,
}

impl StreamOptions {
    /// Reads the query's (decoded) pairs the way the kubelet does (`1` or `true` switch a
    /// stream on); the error is the kubelet's message for an unusable request.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Self, String> {
        let mut opts = StreamOptions::default();
        for (key, value) in pairs {
            let on = matches!(value.as_str(), "1" | "true" | "True" | "TRUE");
            match key.as_str() {
                "command" => opts.command.push(value),
                "input" | "stdin" => opts.stdin = on,
                "output" | "stdout" => opts.stdout = on,
                "error" | "stderr" => opts.stderr = on,
                "tty" => opts.tty = on,
                _ => {}
            }
        }
        // A terminal merges stderr into its one output stream.
        if opts.tty {
            opts.stderr = false;
        }
        if !(opts.stdin || opts.stdout || opts.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".to_owned());
        }
        Ok(opts)
    }
}

/// The Status for a command that exited with 0.
pub fn success() -> Value {
    json!({"metadata": {}, "status": "Success"})
}

/// The Status for a command that exited with `code` (non-zero), as the kubelet writes it: the
/// client reads the code from the `ExitCode` cause and exits with it.
pub fn exit_failure(command: &[String], code: i32) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: error executing command [{}], exit \
             code {code}",
            command.join(" ")
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
    })
}

/// The Status for a session that failed before or instead of running the command.
pub fn internal_error(message: &str) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "code": 500
    })
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn client_frames() {
        assert_eq!(
            parse_client_frame(b"\x00hi", true),
            Ok(ClientFrame::Stdin(b"hi"))
        );
        assert_eq!(
            parse_client_frame(b"\x04{\"Width\":120,\"Height\":40}", false),
            Ok(ClientFrame::Resize {
                width: 120,
                height: 40
            })
        );
        assert_eq!(
            parse_client_frame(&[255, 0], true),
            Ok(ClientFrame::StdinClosed)
        );
        assert_eq!(
            parse_client_frame(&[255, 4], true),
            Ok(ClientFrame::Ignored)
        );
        assert_eq!(parse_client_frame(b"", true), Ok(ClientFrame::Ignored));
        assert!(parse_client_frame(&[255, 0], false).is_err());
        assert!(parse_client_frame(b"\x04{nope", true).is_err());
        assert!(parse_client_frame(b"\x07x", true).is_err());
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn options_read_the_kubelet_query() {
        let opts = StreamOptions::from_pairs(pairs(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo $POD_NAME; exit 3"),
            ("input", "1"),
            ("output", "1"),
            ("error", "1"),
        ]))
        .expect("valid");
        assert_eq!(opts.command, ["sh", "-c", "echo $POD_NAME; exit 3"]);
        assert!(opts.stdin && opts.stdout && opts.stderr && !opts.tty);
        let tty = StreamOptions::from_pairs(pairs(&[
            ("command", "sh"),
            ("input", "1"),
            ("output", "1"),
            ("error", "1"),
            ("tty", "1"),
        ]))
        .expect("valid");
        assert!(tty.tty && !tty.stderr);
        assert_eq!(
            StreamOptions::from_pairs(pairs(&[("command", "ls"), ("output", "0")]))
                .expect_err("no streams"),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }

    #[test]
    fn statuses_read_like_the_kubelet() {
        expect![[r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#]]
        .assert_eq(&exit_failure(&["sh".into(), "-c".into(), "exit 3".into()], 3).to_string());
        expect![[r#"{"metadata":{},"status":"Success"}"#]].assert_eq(&success().to_string());
    }
}
