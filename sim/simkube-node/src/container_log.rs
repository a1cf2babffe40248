//! Container log files in the CRI format that containerd writes and the kubelet reads: one entry
//! per line, `<RFC 3339 time> <stdout|stderr> <F|P> <content>`, `F` for a complete line (its
//! newline dropped), `P` for a piece of a longer line or an unterminated last line. The writer
//! stamps each line as it arrives from the container's pipes; [`render`] turns entries back into
//! what `kubectl logs` prints, byte for byte the container's output, optionally with times.

use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use jiff::Timestamp;
use tokio::io::AsyncReadExt as _;

/// Longest content of one entry; longer lines are split into partial entries (containerd's
/// default `max_container_log_line_size`).
pub const MAX_LINE: usize = 16 * 1024;

/// Which output stream an entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    /// The name in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// One parsed log entry, borrowing its content from the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// When the agent read it from the container.
    pub time: Timestamp,
    /// Where the container wrote it.
    pub stream: Stream,
    /// A piece of a line (no newline follows it in the output).
    pub partial: bool,
    /// The bytes, without the line's newline.
    pub content: &'a [u8],
}

/// Appends the file line of an entry to `out`.
pub fn encode(out: &mut Vec<u8>, time: Timestamp, stream: Stream, partial: bool, content: &[u8]) {
    let tag = if partial { 'P' } else { 'F' };
    let _ = write!(out, "{time} {} {tag} ", stream.as_str());
    out.extend_from_slice(content);
    out.push(b'\n');
}

/// Parses one file line (without its newline); `None` for a malformed line.
pub fn parse(line: &[u8]) -> Option<Entry<'_>> {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let stream = match fields.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let partial = match fields.next()? {
        b"F" => false,
        b"P" => true,
        _ => return None,
    };
    Some(Entry {
        time,
        stream,
        partial,
        content: fields.next().unwrap_or_default(),
    })
}

/// Appends what `kubectl logs` shows for `entry`: its content, the newline of a complete line,
/// and with `timestamps` the kubelet's `<RFC 3339 time> ` prefix.
pub fn render(out: &mut Vec<u8>, entry: &Entry<'_>, timestamps: bool) {
    if timestamps {
        let _ = write!(out, "{} ", entry.time);
    }
    out.extend_from_slice(entry.content);
    if !entry.partial {
        out.push(b'\n');
    }
}

/// Which entries a request wants and how much of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only entries at or after this time (`sinceSeconds`, `sinceTime`).
    pub since: Option<Timestamp>,
    /// Only the last this many entries (`tailLines`).
    pub tail: Option<u64>,
    /// Prefix each entry with its time (`timestamps`).
    pub timestamps: bool,
}

/// The complete lines of `data` (a whole file or a chunk of one) and the length consumed;
/// a trailing unterminated line is left for later (it is still being written).
pub fn lines(data: &[u8]) -> (Vec<&[u8]>, usize) {
    let consumed = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut lines: Vec<&[u8]> = data[..consumed].split(|b| *b == b'\n').collect();
    // `split` yields an empty piece after the final newline (or for no data at all).
    lines.pop();
    (lines, consumed)
}

/// Renders the entries of `data` (a log file) that `selection` picks.
pub fn select(data: &[u8], selection: &Selection) -> Vec<u8> {
    let (lines, _) = lines(data);
    let entries = lines.into_iter().filter_map(parse);
    let entries: Vec<Entry<'_>> = match selection.since {
        Some(since) => entries.filter(|e| e.time >= since).collect(),
        None => entries.collect(),
    };
    let skip = selection.tail.map_or(0, |n| {
        entries
            .len()
            .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX))
    });
    let mut out = Vec::new();
    for entry in &entries[skip..] {
        render(&mut out, entry, selection.timestamps);
    }
    out
}

/// Splits the bytes that came from one stream into entries: complete lines as they end, pieces
/// of [`MAX_LINE`] bytes for longer ones, and what is left at the end as a partial entry.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
}

impl LineSplitter {
    /// Feeds `data`; returns the entries it completes as `(partial, content)`.
    pub fn push(&mut self, mut data: &[u8]) -> Vec<(bool, Vec<u8>)> {
        let mut out = Vec::new();
        while !data.is_empty() {
            let room = MAX_LINE - self.pending.len();
            match data.iter().take(room).position(|b| *b == b'\n') {
                Some(i) => {
                    self.pending.extend_from_slice(&data[..i]);
                    out.push((false, std::mem::take(&mut self.pending)));
                    data = &data[i + 1..];
                }
                None if data.len() >= room => {
                    self.pending.extend_from_slice(&data[..room]);
                    out.push((true, std::mem::take(&mut self.pending)));
                    data = &data[room..];
                }
                None => {
                    self.pending.extend_from_slice(data);
                    data = &[];
                }
            }
        }
        out
    }

    /// The stream ended: an unterminated last line, if any, as a partial entry.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }
}

/// Size at which the writer rotates a log file (the kubelet's default `containerLogMaxSize`).
/// One rotated file (`<run>.log.1`) is kept; like the kubelet, `kubectl logs` reads only the
/// current file.
pub const MAX_FILE: u64 = 10 * 1024 * 1024;

/// The rotated predecessor of log file `path`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Removes the log files (current and rotated) of runs before `keep_from` in a container's log
/// directory: the kubelet keeps the logs of the running and the previous container only.
pub fn prune(dir: &Path, keep_from: i32) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let run = name
            .strip_suffix(".log")
            .or_else(|| name.strip_suffix(".log.1"))
            .and_then(|n| n.parse::<i32>().ok());
        if run.is_some_and(|run| run < keep_from) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// The read ends of a container's stdout and stderr pipes, and the log file they go to.
#[derive(Debug)]
pub struct LogSink {
    file: std::fs::File,
    path: PathBuf,
    max_file: u64,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl LogSink {
    /// Opens (appending to) the log file at `path` and makes the two pipes; returns the sink
    /// and the write ends to give the container as its stdout and stderr.
    pub fn open(path: &Path) -> std::io::Result<(Self, Stdio, Stdio)> {
        Self::open_with_limit(path, MAX_FILE)
    }

    /// [`LogSink::open`] rotating the file at `max_file` bytes instead of [`MAX_FILE`].
    pub fn open_with_limit(path: &Path, max_file: u64) -> std::io::Result<(Self, Stdio, Stdio)> {
        let file = open_append(path)?;
        // Close-on-exec, so no other child inherits a write end and keeps the pipe open.
        let (stdout, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (stderr, stderr_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok((
            Self {
                file,
                path: path.to_owned(),
                max_file,
                stdout,
                stderr,
            },
            Stdio::from(stdout_w),
            Stdio::from(stderr_w),
        ))
    }

    /// Copies both pipes into the file until both reach their end (every process holding a
    /// write end is gone). Call after the container started and the write ends were dropped.
    pub fn start(self) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stdout)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(self.stderr)?;
        let out = Output {
            written: self.file.metadata()?.len(),
            file: self.file,
            path: self.path,
            max_file: self.max_file,
        };
        Ok(tokio::spawn(copy(out, stdout, stderr)))
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The log file being written, rotated when it grows past its limit.
struct Output {
    file: std::fs::File,
    path: PathBuf,
    max_file: u64,
    written: u64,
}

impl Output {
    /// Appends whole entries (a local append to the page cache: short enough to do on the
    /// runtime thread).
    fn write(&mut self, entries: &[u8]) -> std::io::Result<()> {
        self.file.write_all(entries)?;
        self.written += entries.len() as u64;
        if self.written >= self.max_file {
            std::fs::rename(&self.path, rotated(&self.path))?;
            self.file = open_append(&self.path)?;
            self.written = 0;
        }
        Ok(())
    }
}

async fn copy(
    mut out: Output,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
) {
    let mut pipes = [Some(stdout), Some(stderr)];
    let mut splitters = [LineSplitter::default(), LineSplitter::default()];
    let streams = [Stream::Stdout, Stream::Stderr];
    let mut bufs = [vec![0u8; 4096], vec![0u8; 4096]];
    let mut line = Vec::new();
    while pipes.iter().any(Option::is_some) {
        let [a, b] = &mut pipes;
        let [buf_a, buf_b] = &mut bufs;
        // Stdout first when both have data: what one process wrote in order stays in order.
        let (index, read) = tokio::select! {
            biased;
            n = async { a.as_mut().expect("guarded").read(buf_a).await }, if a.is_some() => (0, n),
            n = async { b.as_mut().expect("guarded").read(buf_b).await }, if b.is_some() => (1, n),
        };
        let time = Timestamp::now();
        line.clear();
        match read {
            Ok(n) if n > 0 => {
                for (partial, content) in splitters[index].push(&bufs[index][..n]) {
                    encode(&mut line, time, streams[index], partial, &content);
                }
            }
            _ => {
                pipes[index] = None;
                if let Some(rest) = splitters[index].finish() {
                    encode(&mut line, time, streams[index], true, &rest);
                }
            }
        }
        if !line.is_empty()
            && let Err(error) = out.write(&line)
        {
            tracing::warn!(%error, path = %out.path.display(), "cannot write container log entries");
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use proptest::prelude::*;

    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn file(entries: &[(&str, Stream, bool, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (time, stream, partial, content) in entries {
            encode(&mut out, t(time), *stream, *partial, content.as_bytes());
        }
        out
    }

    #[test]
    fn entries_round_trip_through_the_file_format() {
        let data = file(&[
            (
                "2025-01-02T03:04:05.5Z",
                Stream::Stdout,
                false,
                "hello world",
            ),
            ("2025-01-02T03:04:06Z", Stream::Stderr, true, ""),
        ]);
        expect![[r#"
            2025-01-02T03:04:05.5Z stdout F hello world
            2025-01-02T03:04:06Z stderr P 
        "#]]
        .assert_eq(&String::from_utf8_lossy(&data));
        let (lines, consumed) = lines(&data);
        assert_eq!(consumed, data.len());
        let first = parse(lines[0]).expect("valid");
        assert_eq!(first.content, b"hello world");
        assert_eq!(first.stream, Stream::Stdout);
        assert!(parse(lines[1]).expect("valid").partial);
        assert_eq!(parse(b"garbage"), None);
        assert_eq!(parse(b"2025-01-02T03:04:06Z stdin F x"), None);
    }

    #[test]
    fn selection_filters_tails_and_stamps() {
        let data = file(&[
            ("2025-01-02T03:04:05Z", Stream::Stdout, false, "one"),
            ("2025-01-02T03:04:06.25Z", Stream::Stderr, true, "two-"),
            ("2025-01-02T03:04:07Z", Stream::Stderr, false, "a"),
            ("2025-01-02T03:04:08Z", Stream::Stdout, false, "three"),
        ]);
        let show = |s: Selection| String::from_utf8_lossy(&select(&data, &s)).into_owned();
        assert_eq!(show(Selection::default()), "one\ntwo-a\nthree\n");
        assert_eq!(
            show(Selection {
                tail: Some(2),
                ..Selection::default()
            }),
            "a\nthree\n"
        );
        expect![[r#"
            2025-01-02T03:04:06.25Z two-2025-01-02T03:04:07Z a
            2025-01-02T03:04:08Z three
        "#]]
        .assert_eq(&show(Selection {
            since: Some(t("2025-01-02T03:04:06Z")),
            timestamps: true,
            ..Selection::default()
        }));
        assert_eq!(
            show(Selection {
                tail: Some(0),
                ..Selection::default()
            }),
            ""
        );
    }

    #[test]
    fn an_unterminated_line_waits_for_its_end() {
        let (lines, consumed) = lines(b"a\nb\npart");
        assert_eq!(lines, vec![&b"a"[..], b"b"]);
        assert_eq!(consumed, 4);
        assert_eq!(super::lines(b"part"), (vec![], 0));
    }

    #[test]
    fn long_lines_are_split_at_the_limit() {
        let mut splitter = LineSplitter::default();
        let long = vec![b'x'; MAX_LINE + 3];
        let mut data = long;
        data.extend_from_slice(b"\nend");
        let entries = splitter.push(&data);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0], (true, vec![b'x'; MAX_LINE]));
        assert_eq!(entries[1], (false, b"xxx".to_vec()));
        assert_eq!(splitter.finish(), Some(b"end".to_vec()));
        assert_eq!(splitter.finish(), None);
    }

    #[tokio::test]
    async fn the_writer_rotates_at_its_limit_and_prune_keeps_two_runs() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("3.log");
        let (sink, stdout, stderr) = LogSink::open_with_limit(&path, 200).expect("sink");
        let status = std::process::Command::new("sh")
            .args([
                "-c",
                "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done; echo err >&2",
            ])
            .stdout(stdout)
            .stderr(stderr)
            .status()
            .expect("sh");
        assert!(status.success());
        sink.start().expect("start").await.expect("writer");
        let old = std::fs::read(rotated(&path)).expect("a rotated file");
        let new = std::fs::read(&path).expect("the current file");
        // Rotation happens after the write that crosses the limit: whole entries only.
        assert!(old.len() >= 200, "{}", old.len());
        assert!(!new.is_empty());
        let mut all = select(&old, &Selection::default());
        all.extend(select(&new, &Selection::default()));
        let want: String = (1..=10).map(|i| format!("line {i}\n")).collect::<String>() + "err\n";
        assert_eq!(String::from_utf8_lossy(&all), want);

        for run in ["1.log", "1.log.1", "2.log", "notes.txt"] {
            std::fs::write(dir.path().join(run), "").expect("file");
        }
        prune(dir.path(), 2).expect("prune");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["2.log", "3.log", "3.log.1", "notes.txt"]);
    }

    proptest! {
        /// Whatever the chunking, writing and then rendering gives back the exact output.
        #[test]
        fn output_survives_any_chunking(
            data in proptest::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..3000),
            cuts in proptest::collection::vec(0usize..3000, 0..10),
        ) {
            let mut splitter = LineSplitter::default();
            let mut file = Vec::new();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.push(0);
            cuts.push(data.len());
            cuts.sort_unstable();
            let time = t("2025-01-01T00:00:00Z");
            for pair in cuts.windows(2) {
                for (partial, content) in splitter.push(&data[pair[0]..pair[1]]) {
                    encode(&mut file, time, Stream::Stdout, partial, &content);
                }
            }
            if let Some(rest) = splitter.finish() {
                encode(&mut file, time, Stream::Stdout, true, &rest);
            }
            prop_assert_eq!(select(&file, &Selection::default()), data);
        }
    }
}
