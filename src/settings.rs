//! How a setting is declared, read and checked: the [`settings!`] macro
//! that turns the table of one part of the configuration into the part's
//! struct, its `Default`, its reader and the rows of its documentation;
//! the parsers a row names ([`Parse`]); the [`Reader`] that collects what
//! was refused; and [`ConfigError`]. Each part is declared beside its user
//! (`TcpConfig` in `transport/tcp`, ...); `engine/config.rs` puts them
//! together.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Declares one part of the configuration, each setting once:
///
/// ```text
/// settings! {
///     /// The part's docs.
///     #[derive(Debug, Clone, PartialEq)]
///     pub struct PartType("name") {
///         /// The field's docs.
///         field: Type = default, ["MC_VAR", "MC_ALIAS"], parser, "meaning";
///         field: Type = default, ["MC_VAR"], parser, "meaning", shown "default in the docs";
///         field: Type = default, ["MC_VAR"], parser, "meaning", mooncake "what Mooncake does instead";
///     } then check_fn;
/// }
/// ```
///
/// From it come the struct (every field `pub`), its `Default`,
/// `PartType::read` (each field from the first of its variables that is
/// set, through its parser, a [`Parse`]; `then` runs a check of the whole
/// part afterwards) and `PartType::doc`, its table in
/// `docs/configuration.md` (`<!-- generated: name -->`). `mooncake` says
/// what the variable means to Mooncake where that differs from the row's
/// meaning.
macro_rules! settings {
    (
        $(#[$meta:meta])*
        pub struct $ty:ident($name:literal) {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $fty:ty = $default:expr, [$($var:literal),+], $parser:expr,
                $doc:literal $(, shown $shown:literal)? $(, mooncake $mooncake:literal)?;
            )*
        } $(then $fix:path)?;
    ) => {
        $(#[$meta])*
        pub struct $ty {
            $(
                $(#[$fmeta])*
                pub $field: $fty,
            )*
        }

        impl Default for $ty {
            fn default() -> Self {
                Self { $($field: $default,)* }
            }
        }

        impl $ty {
            /// This part from the variables `r` looks up; a refused value is
            /// recorded in `r` and the default kept.
            pub(crate) fn read(r: &$crate::settings::Reader<'_>) -> Self {
                #[allow(unused_mut)]
                let mut part = Self {
                    $($field: $crate::settings::Parse::<$fty>::read(
                        &$parser,
                        r,
                        &[$($var),+],
                        $default,
                    ),)*
                };
                $($fix(&mut part, r);)?
                part
            }

            /// This part's settings as in effect, in the order of its
            /// table: each row's value as the docs write it, and the first of
            /// its variables `r` finds set (`None`: the default).
            pub(crate) fn effective(
                &self,
                r: &$crate::settings::Reader<'_>,
            ) -> Vec<$crate::settings::Effective> {
                vec![$(
                    $crate::settings::Effective {
                        vars: &[$($var),+],
                        value: $crate::settings::Parse::<$fty>::show(&$parser, &self.$field),
                        set_by: r.first(&[$($var),+]).map(|(var, _)| var),
                    },
                )*]
            }

            /// This part's table in `docs/configuration.md`.
            pub(crate) fn doc() -> $crate::settings::PartDoc {
                $crate::settings::PartDoc {
                    name: $name,
                    rows: vec![$(
                        $crate::settings::RowDoc {
                            vars: &[$($var),+],
                            doc: $doc,
                            default: {
                                #[allow(unused_variables)]
                                let shown = $crate::settings::Parse::<$fty>::show(
                                    &$parser,
                                    &$default,
                                );
                                $(let shown = $shown.to_string();)?
                                shown
                            },
                            allowed: $crate::settings::Parse::<$fty>::allowed(&$parser),
                            mooncake: {
                                #[allow(unused_variables)]
                                let mooncake = "";
                                $(let mooncake = $mooncake;)?
                                mooncake
                            },
                            unsupported: None,
                        },
                    )*],
                }
            }
        }
    };
}
pub(crate) use settings;

/// One row of a part as in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Effective {
    /// The row's variables, as in its [`RowDoc`].
    pub vars: &'static [&'static str],
    /// Its value as the docs write it ([`Parse::show`]; secrets as `<set>`).
    pub value: String,
    /// The first of its variables that is set; `None`: none is, the value
    /// is the default.
    pub set_by: Option<&'static str>,
}

/// The documentation of one part: its name (the marker of its table in
/// `docs/configuration.md`) and one row per setting.
#[derive(Debug, Clone)]
pub(crate) struct PartDoc {
    /// The part's name, as in `<!-- generated: NAME -->`.
    pub name: &'static str,
    /// Its settings.
    pub rows: Vec<RowDoc>,
}

/// One row of a generated table.
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct RowDoc {
    /// The variable, then the others read when it is unset (or the
    /// variables that together make one setting).
    pub vars: &'static [&'static str],
    /// What it means.
    pub doc: &'static str,
    /// Its default, as written in the docs.
    pub default: String,
    /// What it takes.
    pub allowed: String,
    /// What it means to Mooncake, where that differs (empty: the same, or
    /// not a Mooncake variable).
    pub mooncake: &'static str,
    /// Why the engine does not read it, for a Mooncake variable it
    /// ignores.
    pub unsupported: Option<&'static str>,
}

/// Values of `MC_*` variables that are not allowed: each names the
/// variable, its value and what it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    /// One message per refused value, e.g. `MC_SLICE_SIZE=abc is not a
    /// number in 1..=1099511627776`.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.problems.join("; "))
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for crate::error::Error {
    fn from(e: ConfigError) -> Self {
        crate::error::Error::InvalidArgument(format!("bad configuration: {e}"))
    }
}

/// Looks variables up through a function (so tests need no process
/// environment) and collects the refused values and the warnings.
pub struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    errors: std::cell::RefCell<Vec<String>>,
    warnings: std::cell::RefCell<Vec<String>>,
}

impl<'a> Reader<'a> {
    /// A reader of the variables `lookup` gives.
    pub(crate) fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Reader<'a> {
        Reader {
            lookup,
            errors: Default::default(),
            warnings: Default::default(),
        }
    }

    /// The value of `name`, trimmed, when it is set.
    pub(crate) fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name).map(|v| v.trim().to_string())
    }

    /// The first of `vars` that is set, with its value.
    pub(crate) fn first(&self, vars: &[&'static str]) -> Option<(&'static str, String)> {
        vars.iter().find_map(|&v| self.raw(v).map(|x| (v, x)))
    }

    /// Records a refused value.
    pub(crate) fn error(&self, msg: String) {
        self.errors.borrow_mut().push(msg);
    }

    /// Records a warning (a setting that is allowed but not used as set).
    pub(crate) fn warn(&self, msg: String) {
        self.warnings.borrow_mut().push(msg);
    }

    /// The warnings, or the refused values.
    pub(crate) fn finish(self) -> Result<Vec<String>, ConfigError> {
        let problems = self.errors.into_inner();
        if problems.is_empty() {
            Ok(self.warnings.into_inner())
        } else {
            Err(ConfigError { problems })
        }
    }
}

/// How a row reads its variable: what a value means, what is allowed,
/// and how a value is written in the docs.
pub(crate) trait Parse<T> {
    /// The value `raw` (trimmed) stands for, or `None` if it is not allowed.
    fn parse(&self, raw: &str) -> Option<T>;

    /// What is allowed, as the end of "`VAR=value` is not ...".
    fn allowed(&self) -> String;

    /// `v` as the docs and `transfer-engine-info` write it (a secret as
    /// `<set>`, never itself).
    fn show(&self, v: &T) -> String;

    /// The setting: `default` when none of `vars` is set, else the first
    /// one's value; a refused value is recorded and `default` kept.
    fn read(&self, r: &Reader<'_>, vars: &[&'static str], default: T) -> T {
        let Some((var, raw)) = r.first(vars) else {
            return default;
        };
        match self.parse(&raw) {
            Some(v) => v,
            None => {
                r.error(format!("{var}={raw} is not {}", self.allowed()));
                default
            }
        }
    }
}

/// A number written in the docs, with its size in KiB, MiB, GiB or TiB
/// when it is a whole number of them.
fn show_number(n: impl fmt::Display) -> String {
    let s = n.to_string();
    let Ok(v) = s.parse::<u64>() else {
        return s;
    };
    for (unit, name) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if v >= 1 << unit && v % (1 << unit) == 0 {
            return format!("{v} ({} {name})", v >> unit);
        }
    }
    s
}

/// A number in `lo..=hi`.
pub(crate) struct Range<T>(pub T, pub T);

impl<T: FromStr + PartialOrd + Copy + fmt::Display> Parse<T> for Range<T> {
    fn parse(&self, raw: &str) -> Option<T> {
        raw.parse::<T>()
            .ok()
            .filter(|n| *n >= self.0 && *n <= self.1)
    }
    fn allowed(&self) -> String {
        format!("a number in {}..={}", self.0, self.1)
    }
    fn show(&self, v: &T) -> String {
        show_number(v)
    }
}

/// A whole number up to `hi`; one below `lo` (negative ones too) counts
/// as `lo`, as Mooncake reads `MC_TRANSFER_TIMEOUT`.
pub(crate) struct AtLeast(pub u64, pub u64);

impl Parse<u64> for AtLeast {
    fn parse(&self, raw: &str) -> Option<u64> {
        let n = raw.parse::<i64>().ok()?;
        match u64::try_from(n) {
            Ok(n) if n > self.1 => None,
            Ok(n) => Some(n.max(self.0)),
            Err(_) => Some(self.0),
        }
    }
    fn allowed(&self) -> String {
        format!("a number up to {} (below {}: {})", self.1, self.0, self.0)
    }
    fn show(&self, v: &u64) -> String {
        show_number(v)
    }
}

/// A number in `lo..=hi`, or -1 for none.
pub(crate) struct OrUnset<T>(pub T, pub T);

impl<T: FromStr + PartialOrd + Copy + fmt::Display> Parse<Option<T>> for OrUnset<T> {
    fn parse(&self, raw: &str) -> Option<Option<T>> {
        if raw == "-1" {
            return Some(None);
        }
        Range(self.0, self.1).parse(raw).map(Some)
    }
    fn allowed(&self) -> String {
        format!("-1 or a number in {}..={}", self.0, self.1)
    }
    fn show(&self, v: &Option<T>) -> String {
        v.map_or("-1".to_string(), |n| n.to_string())
    }
}

/// A number in `0..=hi`: on unless 0 (`MC_IB_PCI_RELAXED_ORDERING`).
pub(crate) struct NonZero(pub u8);

impl Parse<bool> for NonZero {
    fn parse(&self, raw: &str) -> Option<bool> {
        Range(0, self.0).parse(raw).map(|n| n != 0)
    }
    fn allowed(&self) -> String {
        Parse::<u8>::allowed(&Range(0, self.0))
    }
    fn show(&self, v: &bool) -> String {
        u8::from(*v).to_string()
    }
}

/// -1 (decide), 0 (never) or 1 (always).
pub(crate) struct Tristate;

impl Parse<Option<bool>> for Tristate {
    fn parse(&self, raw: &str) -> Option<Option<bool>> {
        match raw {
            "-1" => Some(None),
            "0" => Some(Some(false)),
            "1" => Some(Some(true)),
            _ => None,
        }
    }
    fn allowed(&self) -> String {
        "-1, 0 or 1".to_string()
    }
    fn show(&self, v: &Option<bool>) -> String {
        match v {
            None => "-1",
            Some(false) => "0",
            Some(true) => "1",
        }
        .to_string()
    }
}

/// One of a few numbers.
pub(crate) struct Choices<T: 'static>(pub &'static [T]);

impl<T: FromStr + PartialEq + Copy + fmt::Display> Parse<T> for Choices<T> {
    fn parse(&self, raw: &str) -> Option<T> {
        raw.parse::<T>().ok().filter(|n| self.0.contains(n))
    }
    fn allowed(&self) -> String {
        one_of(self.0.iter().map(|n| n.to_string()))
    }
    fn show(&self, v: &T) -> String {
        v.to_string()
    }
}

/// "one of A, B or C".
fn one_of(words: impl Iterator<Item = String>) -> String {
    let words: Vec<String> = words.collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("one of {} or {last}", rest.join(", "))
        }
        _ => words.join(""),
    }
}

/// One of a few words (any case); the first word of a value is the one
/// the docs show.
pub(crate) struct Words<T: 'static>(pub &'static [(&'static str, T)]);

impl<T: PartialEq + Copy> Parse<T> for Words<T> {
    fn parse(&self, raw: &str) -> Option<T> {
        self.0
            .iter()
            .find(|(w, _)| w.eq_ignore_ascii_case(raw))
            .map(|(_, v)| *v)
    }
    fn allowed(&self) -> String {
        one_of(self.0.iter().map(|(w, _)| w.to_string()))
    }
    fn show(&self, v: &T) -> String {
        self.0
            .iter()
            .find(|(_, x)| x == v)
            .map_or(String::new(), |(w, _)| w.to_string())
    }
}

/// A switch: off when unset, empty, `0`, `false`, `no` or `off` (any
/// case), on otherwise.
pub(crate) struct Switch;

impl Parse<bool> for Switch {
    fn parse(&self, raw: &str) -> Option<bool> {
        Some(!matches!(
            raw.to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        ))
    }
    fn allowed(&self) -> String {
        "any (off: empty, 0, false, no, off)".to_string()
    }
    fn show(&self, v: &bool) -> String {
        if *v { "on" } else { "off" }.to_string()
    }
}

/// On only for `1`, `true`, `yes` or `on` (any case), as Mooncake reads
/// `MC_TE_METRIC`; anything else is off.
pub(crate) struct OnWords;

impl Parse<bool> for OnWords {
    fn parse(&self, raw: &str) -> Option<bool> {
        Some(matches!(
            raw.to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        ))
    }
    fn allowed(&self) -> String {
        "any (on: 1, true, yes, on)".to_string()
    }
    fn show(&self, v: &bool) -> String {
        Switch.show(v)
    }
}

/// Mooncake's "set at all": any value, even empty or `0`, turns it on.
/// `Set(false)` gives the opposite (a variable that disables).
pub(crate) struct Set(pub bool);

impl Parse<bool> for Set {
    fn parse(&self, _raw: &str) -> Option<bool> {
        Some(self.0)
    }
    fn allowed(&self) -> String {
        "any (set)".to_string()
    }
    fn show(&self, v: &bool) -> String {
        if *v == self.0 { "set" } else { "unset" }.to_string()
    }
}

/// Text; empty is the same as unset.
pub(crate) struct Text;

impl Parse<Option<String>> for Text {
    fn parse(&self, raw: &str) -> Option<Option<String>> {
        Some((!raw.is_empty()).then(|| raw.to_string()))
    }
    fn allowed(&self) -> String {
        "text".to_string()
    }
    fn show(&self, v: &Option<String>) -> String {
        v.clone().unwrap_or_else(|| "unset".to_string())
    }
}

/// A socket address, `ip:port` (`[ip6]:port`); empty is the same as
/// unset.
pub(crate) struct SockAddr;

impl Parse<Option<std::net::SocketAddr>> for SockAddr {
    fn parse(&self, raw: &str) -> Option<Option<std::net::SocketAddr>> {
        if raw.is_empty() {
            return Some(None);
        }
        raw.parse().ok().map(Some)
    }
    fn allowed(&self) -> String {
        "an address ip:port (e.g. 127.0.0.1:9100, [::1]:9100, 0.0.0.0:9100)".to_string()
    }
    fn show(&self, v: &Option<std::net::SocketAddr>) -> String {
        v.map_or("unset".to_string(), |a| a.to_string())
    }
}

/// Text kept as set, empty included (`CUDA_VISIBLE_DEVICES=` shows no GPU).
pub(crate) struct SetText;

impl Parse<Option<String>> for SetText {
    fn parse(&self, raw: &str) -> Option<Option<String>> {
        Some(Some(raw.to_string()))
    }
    fn allowed(&self) -> String {
        "text".to_string()
    }
    fn show(&self, v: &Option<String>) -> String {
        Text.show(v)
    }
}

/// A path of a file; empty is the same as unset.
pub(crate) struct FilePath;

impl Parse<Option<PathBuf>> for FilePath {
    fn parse(&self, raw: &str) -> Option<Option<PathBuf>> {
        Some((!raw.is_empty()).then(|| PathBuf::from(raw)))
    }
    fn allowed(&self) -> String {
        "a path".to_string()
    }
    fn show(&self, v: &Option<PathBuf>) -> String {
        v.as_ref()
            .map_or("unset".to_string(), |p| p.display().to_string())
    }
}

/// A comma list; blanks around items and empty items are dropped.
pub(crate) struct List;

impl Parse<Vec<String>> for List {
    fn parse(&self, raw: &str) -> Option<Vec<String>> {
        Some(
            raw.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
        )
    }
    fn allowed(&self) -> String {
        "a comma list".to_string()
    }
    fn show(&self, v: &Vec<String>) -> String {
        if v.is_empty() {
            "unset".to_string()
        } else {
            v.join(",")
        }
    }
}
