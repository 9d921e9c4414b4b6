//! Which services a bridge carries: allow and deny lists of globs, and the small
//! configuration file that can hold them.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Allow and deny lists of service-name globs (`*` any run of characters, `/` included;
/// `?` one character). A service passes if it matches an allow glob (or the allow list
/// is empty) and no deny glob: deny wins.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Globs of the services carried; empty: all.
    pub allow: Vec<String>,
    /// Globs of the services never carried, whatever `allow` says.
    pub deny: Vec<String>,
}

impl Policy {
    /// Whether service `name` crosses the bridge (in either direction).
    pub fn passes(&self, name: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|g| glob(g, name));
        allowed && !self.deny.iter().any(|g| glob(g, name))
    }
}

/// Whether `name` matches `pattern` (`*`: any run, `?`: one character).
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Greedy with one backtrack point, the usual wildcard matcher: linear for one `*`,
    // never exponential.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// What a configuration file may set; flags add to the lists and override the rest.
#[derive(Clone, Debug, Default)]
pub struct FileConfig {
    pub group: Option<String>,
    pub scope: Option<String>,
    pub listen: Vec<String>,
    pub connect: Vec<String>,
    pub policy: Policy,
    pub max_message: Option<usize>,
    pub call_timeout: Option<Duration>,
}

/// Parses a configuration file: one `key value` per line, `#` starts a comment. Keys:
/// `group`, `scope`, `listen`, `connect`, `allow`, `deny` (these four may repeat),
/// `max-message` (bytes, with an optional K, M or G suffix), `call-timeout-ms`.
pub fn parse_file(text: &str) -> Result<FileConfig> {
    let mut c = FileConfig::default();
    for (no, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (key, value) = line
            .split_once(char::is_whitespace)
            .map(|(k, v)| (k, v.trim()))
            .with_context(|| format!("line {}: expected `key value`", no + 1))?;
        match key {
            "group" => c.group = Some(value.to_owned()),
            "scope" => c.scope = Some(value.to_owned()),
            "listen" => c.listen.push(value.to_owned()),
            "connect" => c.connect.push(value.to_owned()),
            "allow" => c.policy.allow.push(value.to_owned()),
            "deny" => c.policy.deny.push(value.to_owned()),
            "max-message" => c.max_message = Some(parse_size(value)?),
            "call-timeout-ms" => {
                c.call_timeout =
                    Some(Duration::from_millis(value.parse().with_context(|| {
                        format!("line {}: bad milliseconds", no + 1)
                    })?))
            }
            other => bail!("line {}: unknown key {other:?}", no + 1),
        }
    }
    Ok(c)
}

/// A byte count with an optional K, M or G (binary) suffix.
pub fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits
        .trim()
        .parse()
        .with_context(|| format!("bad size {s:?}"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .with_context(|| format!("size {s:?} too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("camera/*", "camera/front"));
        assert!(glob("*", "a/b/c"));
        assert!(glob("cam?ra/*/raw", "camera/front/raw"));
        assert!(!glob("camera/*", "lidar/top"));
        assert!(!glob("camera", "camera/front"));
        assert!(glob("*secret*", "x/secret/y"));
    }

    #[test]
    fn deny_wins() {
        let p = Policy {
            allow: vec!["camera/*".into()],
            deny: vec!["camera/private*".into()],
        };
        assert!(p.passes("camera/front"));
        assert!(!p.passes("camera/private"));
        assert!(!p.passes("lidar"));
        assert!(Policy::default().passes("anything"));
    }

    #[test]
    fn file() {
        let c = parse_file(
            "# a bridge\ngroup robot\nlisten tcp/0.0.0.0:7447\nallow camera/*\ndeny camera/raw # big\nmax-message 64M\n",
        )
        .unwrap();
        assert_eq!(c.group.as_deref(), Some("robot"));
        assert_eq!(c.listen, ["tcp/0.0.0.0:7447"]);
        assert_eq!(c.policy.deny, ["camera/raw"]);
        assert_eq!(c.max_message, Some(64 << 20));
        assert!(parse_file("bogus 1").is_err());
    }
}
