//! Progress of long commands: each phase with its elapsed time. A spinner on a terminal, plain
//! lines otherwise (logs, CI, pipes). Everything goes to stderr so stdout stays for results.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Reports the phases of one command.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    phase_start: Instant,
    spinner: Option<ProgressBar>,
    last_update: Option<String>,
    quiet: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    /// A spinner when stderr is a terminal, plain lines otherwise.
    pub fn new() -> Self {
        Self::with_spinner(std::io::stderr().is_terminal())
    }

    /// Plain lines (no spinner) or a spinner, as asked.
    pub fn with_spinner(spinner: bool) -> Self {
        let now = Instant::now();
        Self {
            start: now,
            phase_start: now,
            spinner: spinner.then(ProgressBar::hidden),
            last_update: None,
            quiet: false,
        }
    }

    /// Reports nothing (library callers and `-o json` of short commands).
    pub fn quiet() -> Self {
        let mut p = Self::with_spinner(false);
        p.quiet = true;
        p
    }

    /// Time since the command started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Starts a phase.
    pub fn phase(&mut self, what: impl Into<String>) {
        let what = what.into();
        self.phase_start = Instant::now();
        self.last_update = None;
        if self.quiet {
            return;
        }
        match &mut self.spinner {
            Some(bar) => {
                let fresh = ProgressBar::new_spinner().with_style(
                    ProgressStyle::with_template("{spinner} [{elapsed:>4}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                fresh.enable_steady_tick(Duration::from_millis(100));
                fresh.set_message(what);
                *bar = fresh;
            }
            None => self.line(&format!("{what} ...")),
        }
    }

    /// A change within the current phase (a rollout count, a new condition). Plain output
    /// prints it only when it differs from the previous update.
    pub fn update(&mut self, what: impl Into<String>) {
        let what = what.into();
        if self.quiet || self.last_update.as_deref() == Some(what.as_str()) {
            return;
        }
        self.last_update = Some(what.clone());
        match &self.spinner {
            Some(bar) => bar.set_message(what),
            None => self.line(&format!("  {what}")),
        }
    }

    /// A line that stays (above the spinner, if any).
    pub fn note(&mut self, what: impl AsRef<str>) {
        if self.quiet {
            return;
        }
        let line = self.stamp(what.as_ref());
        match &self.spinner {
            Some(bar) if !bar.is_finished() && !bar.is_hidden() => bar.println(line),
            _ => eprintln!("{line}"),
        }
    }

    /// Ends the current phase successfully.
    pub fn done(&mut self, what: impl AsRef<str>) {
        self.finish("✓", what.as_ref());
    }

    /// Ends the current phase with a failure.
    pub fn failed(&mut self, what: impl AsRef<str>) {
        self.finish("✗", what.as_ref());
    }

    fn finish(&mut self, mark: &str, what: &str) {
        if self.quiet {
            return;
        }
        let took = self.phase_start.elapsed();
        if let Some(bar) = &self.spinner {
            bar.finish_and_clear();
        }
        self.line(&format!("{mark} {what} ({})", seconds(took)));
    }

    fn line(&self, what: &str) {
        let line = self.stamp(what);
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
    }

    fn stamp(&self, what: &str) -> String {
        format!("[{:>6}] {what}", seconds(self.elapsed()))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.spinner {
            bar.finish_and_clear();
        }
    }
}

/// `1.2s`.
pub fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}
