//! The kernel command line grub measures for the first `menuentry` of a `grub.cfg`: what a
//! boot policy's `commandLine` is compared with.
//!
//! grub runs the entry's `linux PATH ARGS...` and, building the kernel's command line
//! (`grub_create_loader_cmdline`, `grub-core/lib/cmdline.c`), measures into PCR 8 the words
//! after `linux` (the kernel's path first) joined by single spaces, each `\`, `'` and `"`
//! escaped with a backslash (a `\xHH` sequence kept) and a word holding a space put in double
//! quotes; the log's event reads `kernel_cmdline: ` followed by that text (checked on the real
//! Ubuntu 21.04 log of `testdata/event_logs/`: its event 96 is
//! `kernel_cmdline: /boot/vmlinuz-5.11.0-1006-gcp root=PARTUUID=... ro console=ttyS0 panic=-1`,
//! its digest the SHA-256 of the text after the prefix, without the NUL).
//!
//! The words are grub's script words: blanks separate them, `'...'` is literal, `"..."` and
//! bare text expand `$name` and `${name}` and take `\` as an escape, and a bare expansion is
//! split on blanks (an empty one gives no word). A variable is expanded only when `grub.cfg`
//! sets it exactly once (`set name=value`): a value that depends on which branch ran at boot
//! cannot be read from the file, and the caller must be told to give the command line itself.

use std::collections::BTreeMap;

/// Why the command line cannot be read from a `grub.cfg`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrubCfgError {
    /// No `menuentry` with a `linux` line.
    #[error("grub.cfg has no menuentry with a linux (or linuxefi) line")]
    NoLinuxEntry,
    /// The `linux` line uses a variable the file does not set exactly once.
    #[error(
        "grub.cfg's first menuentry's linux line uses ${name}, which grub.cfg sets {times} times: \
         its value at boot cannot be read from the file"
    )]
    Variable {
        /// The variable.
        name: String,
        /// How many `set` lines name it.
        times: usize,
    },
    /// Unbalanced quotes.
    #[error("grub.cfg's linux line has an unterminated quote: {0}")]
    Quote(String),
}

/// The first `menuentry`'s kernel command line as grub measures it (without the
/// `kernel_cmdline: ` prefix), and the kernel path it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCommandLine {
    /// What `kernel_cmdline: ` is followed by.
    pub measured: String,
    /// The `linux` line's first word (`/boot/vmlinuz-6.1.0-28-amd64`).
    pub kernel_path: String,
}

/// Reads `cfg` (a `grub.cfg`'s text).
pub fn first_entry_command_line(cfg: &str) -> Result<EntryCommandLine, GrubCfgError> {
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    let entry = lines
        .iter()
        .position(|l| first_word(l) == Some("menuentry"))
        .ok_or(GrubCfgError::NoLinuxEntry)?;
    // The entry's lines, up to the brace that closes it.
    let mut depth = 0usize;
    let mut first = true;
    let mut body = lines[entry..].iter().take_while(|l| {
        let open = depth > 0 || first;
        first = false;
        depth += l.matches('{').count();
        depth = depth.saturating_sub(l.matches('}').count());
        open
    });
    let linux = body
        .find(|l| matches!(first_word(l), Some("linux" | "linuxefi")))
        .ok_or(GrubCfgError::NoLinuxEntry)?;
    let variables = set_variables(&lines);
    let words = split_words(linux, &variables)?;
    let argv = words.get(1..).unwrap_or_default();
    let kernel_path = argv.first().cloned().ok_or(GrubCfgError::NoLinuxEntry)?;
    let measured = loader_command_line(argv);
    Ok(EntryCommandLine { measured, kernel_path })
}

/// What grub's `linux` loader measures for `argv` (the kernel's path, then its arguments): the
/// words as `grub_create_loader_cmdline` writes them, joined by single spaces.
pub fn loader_command_line(argv: &[String]) -> String {
    argv.iter().map(|w| loader_word(w)).collect::<Vec<_>>().join(" ")
}

/// grub's words of `text` with `variables` expanded, as its script runs them: what a menu
/// entry that grub builds at boot (RHEL-family grub's `blscfg` from a BLS entry) hands its
/// `linux` command. A variable not in `variables` is [`GrubCfgError::Variable`] with `times` 0.
pub fn expand_words(text: &str, variables: &BTreeMap<String, String>) -> Result<Vec<String>, GrubCfgError> {
    let variables = variables
        .iter()
        .map(|(name, value)| (name.clone(), (1, value.clone())))
        .collect();
    split_words(text, &variables)
}

/// The variables `cfg` (a `grub.cfg`'s text) sets exactly once, with their values: the ones
/// whose value at boot the file alone decides, where nothing (`grubenv`) set them before.
pub fn set_once(cfg: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = cfg.lines().map(str::trim).collect();
    set_variables(&lines)
        .into_iter()
        .filter(|(_, (times, _))| *times == 1)
        .map(|(name, (_, value))| (name, value))
        .collect()
}

fn first_word(line: &str) -> Option<&str> {
    line.split_ascii_whitespace().next()
}

/// Every `set name=value` of the file: the value, or `None` when set more than once, and the
/// count.
fn set_variables(lines: &[&str]) -> BTreeMap<String, (usize, String)> {
    let mut out: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for line in lines {
        // `set` may follow `then`/`else`/`;` on one line: look at each command.
        for command in line.split(';') {
            let mut command = command.trim();
            for keyword in ["then ", "else ", "do "] {
                command = command.strip_prefix(keyword).unwrap_or(command).trim_start();
            }
            let Some(assignment) = command.strip_prefix("set ") else {
                continue;
            };
            let Some((name, value)) = assignment.trim().split_once('=') else {
                continue;
            };
            // The value as a word without expansion (quotes removed).
            let value = split_words(value, &BTreeMap::new())
                .map(|w| w.join(" "))
                .unwrap_or_else(|_| value.to_owned());
            let slot = out.entry(name.to_owned()).or_insert((0, String::new()));
            slot.0 += 1;
            slot.1 = value;
        }
    }
    out
}

/// grub's words of one command line, variables expanded.
fn split_words(line: &str, variables: &BTreeMap<String, (usize, String)>) -> Result<Vec<String>, GrubCfgError> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether the current word exists even if empty (a quoted "" is a word).
    let mut started = false;
    let mut chars = line.chars().peekable();
    let expand = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| -> Result<Option<String>, GrubCfgError> {
        let name: String = if chars.peek() == Some(&'{') {
            chars.next();
            let name: String = chars.by_ref().take_while(|c| *c != '}').collect();
            name
        } else {
            let mut name = String::new();
            while let Some(c) = chars.peek().copied().filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
                name.push(c);
                chars.next();
            }
            name
        };
        if name.is_empty() {
            return Ok(None);
        }
        match variables.get(&name) {
            Some((1, value)) => Ok(Some(value.clone())),
            Some((times, _)) => Err(GrubCfgError::Variable { name, times: *times }),
            None => Err(GrubCfgError::Variable { name, times: 0 }),
        }
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            '\\' => {
                if let Some(next) = chars.next() {
                    word.push(next);
                    started = true;
                }
            }
            '\'' => {
                let mut closed = false;
                for q in chars.by_ref() {
                    if q == '\'' {
                        closed = true;
                        break;
                    }
                    word.push(q);
                }
                if !closed {
                    return Err(GrubCfgError::Quote(line.to_owned()));
                }
                started = true;
            }
            '"' => {
                let mut closed = false;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => {
                            closed = true;
                            break;
                        }
                        '\\' => match chars.next() {
                            Some(e @ ('$' | '"' | '\\')) => word.push(e),
                            Some(other) => {
                                word.push('\\');
                                word.push(other);
                            }
                            None => {}
                        },
                        '$' => match expand(&mut chars)? {
                            Some(value) => word.push_str(&value),
                            None => word.push('$'),
                        },
                        other => word.push(other),
                    }
                }
                if !closed {
                    return Err(GrubCfgError::Quote(line.to_owned()));
                }
                started = true;
            }
            '$' => match expand(&mut chars)? {
                // A bare expansion is split on blanks; its first part joins the current word.
                Some(value) => {
                    let mut parts = value.split([' ', '\t']).filter(|p| !p.is_empty()).peekable();
                    while let Some(part) = parts.next() {
                        word.push_str(part);
                        started = true;
                        if parts.peek().is_some() {
                            words.push(std::mem::take(&mut word));
                        }
                    }
                    if value.ends_with([' ', '\t']) && started {
                        words.push(std::mem::take(&mut word));
                        started = false;
                    }
                }
                None => {
                    word.push('$');
                    started = true;
                }
            },
            other => {
                word.push(other);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    Ok(words)
}

/// One word as `grub_create_loader_cmdline` writes it.
fn loader_word(word: &str) -> String {
    let bytes = word.as_bytes();
    let mut out = String::with_capacity(word.len() + 2);
    let quoted = word.contains(' ');
    if quoted {
        out.push('"');
    }
    let mut i = 0;
    for (at, c) in word.char_indices() {
        if at < i {
            continue;
        }
        let hex_escape = c == '\\'
            && bytes.get(at + 1) == Some(&b'x')
            && bytes.get(at + 2).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(at + 3).is_some_and(u8::is_ascii_hexdigit);
        if hex_escape {
            out.push_str(&word[at..at + 4]);
            i = at + 4;
            continue;
        }
        if matches!(c, '\\' | '\'' | '"') {
            out.push('\\');
        }
        out.push(c);
    }
    if quoted {
        out.push('"');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first entry as Debian 12's `grub-mkconfig` (`10_linux`) writes it.
    const DEBIAN: &str = r#"
set default="0"
function load_video {
  insmod all_video
}
menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class gnu --class os $menuentry_id_option 'gnulinux-simple-0a1b' {
	load_video
	insmod gzio
	if [ x$grub_platform = xxen ]; then insmod xzio; insmod lzopio; fi
	insmod part_gpt
	insmod ext2
	search --no-floppy --fs-uuid --set=root 0a1b
	echo	'Loading Linux 6.1.0-28-amd64 ...'
	linux	/boot/vmlinuz-6.1.0-28-amd64 root=UUID=0a1b ro  console=tty0 console=ttyS0,115200 earlyprintk=ttyS0,115200 consoleblank=0
	echo	'Loading initial ramdisk ...'
	initrd	/boot/initrd.img-6.1.0-28-amd64
}
submenu 'Advanced options for Debian GNU/Linux' $menuentry_id_option 'gnulinux-advanced-0a1b' {
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-27-amd64' {
		linux	/boot/vmlinuz-6.1.0-27-amd64 root=UUID=0a1b ro single
	}
}
"#;

    #[test]
    fn debians_first_entry_is_its_linux_words_joined_by_single_spaces() {
        let line = first_entry_command_line(DEBIAN).expect("command line");
        assert_eq!(line.kernel_path, "/boot/vmlinuz-6.1.0-28-amd64");
        assert_eq!(
            line.measured,
            "/boot/vmlinuz-6.1.0-28-amd64 root=UUID=0a1b ro console=tty0 console=ttyS0,115200 \
             earlyprintk=ttyS0,115200 consoleblank=0"
        );
    }

    #[test]
    fn the_ubuntu_log_s_command_line_is_what_its_linux_line_gives() {
        // Event 94 of ubuntu_2104_shielded_vm_no_secure_boot_eventlog ran this line, event 96
        // measured the text below.
        let cfg = "menuentry 'Ubuntu' {\n\tlinux\t/boot/vmlinuz-5.11.0-1006-gcp \
                   root=PARTUUID=6443a6ae-e5e9-4df7-9a06-d1329e50f33c ro console=ttyS0 panic=-1\n}\n";
        assert_eq!(
            first_entry_command_line(cfg).expect("command line").measured,
            "/boot/vmlinuz-5.11.0-1006-gcp root=PARTUUID=6443a6ae-e5e9-4df7-9a06-d1329e50f33c ro \
             console=ttyS0 panic=-1"
        );
    }

    #[test]
    fn variables_set_once_are_expanded_and_split_and_others_refused() {
        let cfg = "set extra=\"quiet  splash\"\nset empty=\nmenuentry x {\n linux /vmlinuz ro $extra ${empty} \"a $extra\"\n}\n";
        assert_eq!(
            first_entry_command_line(cfg).expect("command line").measured,
            r#"/vmlinuz ro quiet splash "a quiet  splash""#
        );
        let cfg =
            "if [ x = y ]; then set vt=vt.handoff=7; else set vt=; fi\nmenuentry x {\n linux /vmlinuz ro $vt\n}\n";
        assert_eq!(
            first_entry_command_line(cfg),
            Err(GrubCfgError::Variable {
                name: "vt".into(),
                times: 2
            })
        );
        let cfg = "menuentry x {\n linux /vmlinuz ro $nowhere\n}\n";
        assert_eq!(
            first_entry_command_line(cfg),
            Err(GrubCfgError::Variable {
                name: "nowhere".into(),
                times: 0
            })
        );
    }

    #[test]
    fn quotes_are_removed_and_loader_escapes_added() {
        let cfg = "menuentry x {\n linux /vmlinuz 'a=b c' d=\\\"e\\\" f='x\\x41'\n}\n";
        assert_eq!(
            first_entry_command_line(cfg).expect("command line").measured,
            r#"/vmlinuz "a=b c" d=\"e\" f=x\x41"#
        );
        assert!(matches!(
            first_entry_command_line("menuentry x {\n linux /vmlinuz 'open\n}\n"),
            Err(GrubCfgError::Quote(_))
        ));
    }

    #[test]
    fn a_cfg_without_an_entry_says_so() {
        assert_eq!(first_entry_command_line("set a=b\n"), Err(GrubCfgError::NoLinuxEntry));
        assert_eq!(
            first_entry_command_line("menuentry x {\n chainloader /x.efi\n}\nmenuentry y {\n linux /v\n}\n"),
            Err(GrubCfgError::NoLinuxEntry)
        );
    }
}
