//! What the command line says about itself outside a run: the shells'
//! completion scripts (`completions SHELL`) and the manual page (`man`).

use std::io::Write;

use clap::CommandFactory;
use roff::{bold, roman, Roff};

/// The program's name, as the shells and `man` know it.
const BIN: &str = "gem-resources";

/// `completions SHELL`: the shell's completion script.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cli = crate::cli::Args::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, BIN, &mut script);
    if shell == clap_complete::Shell::Bash {
        script = bash_subcommand_arms(&String::from_utf8_lossy(&script)).into_bytes();
    }
    script
}

/// Repairs clap_complete's bash script for a binary whose name has a
/// hyphen (<https://github.com/clap-rs/clap/issues/6421>, still in 4.6.12):
/// the loop over the words names the state of `gem-resources install`
/// `gem__resources__subcmd__install`, but the `case` arm that completes its
/// options is labelled `gem__subcmd__resources__subcmd__install` (the
/// hyphen of the program's name escaped as a subcommand separator), so no
/// arm matched and nothing completed after the subcommand. The arms are
/// relabelled the way the loop spells them; a script that is already
/// right is left as it is.
fn bash_subcommand_arms(script: &str) -> String {
    let wrong = BIN.replace('-', "__subcmd__");
    let right = BIN.replace('-', "__");
    if wrong == right {
        return script.to_string();
    }
    let arm = format!("{wrong}__subcmd__");
    let mut out = String::with_capacity(script.len());
    for line in script.split_inclusive('\n') {
        let body = line.trim_start();
        // Only an arm's label: `        gem__subcmd__resources__subcmd__install)`.
        let is_arm = body.starts_with(&arm) && body.trim_end().ends_with(')');
        match body.strip_prefix(&wrong).filter(|_| is_arm) {
            Some(rest) => {
                out.push_str(&line[..line.len() - body.len()]);
                out.push_str(&right);
                out.push_str(rest);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `man`: one manual page (roff) for the program and every subcommand:
/// the global options, then each command with its synopsis, what it
/// does, its own options and its example; then the exit statuses, the
/// environment and the files, as roff lists (never `--help`'s columns,
/// which roff would fill into one run of words).
pub fn page() -> std::io::Result<Vec<u8>> {
    let cli = crate::cli::Args::command().subcommand_value_name("COMMAND");
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cli.clone());
    man.render_title(&mut out)?;
    for render in [
        clap_mangen::Man::render_name_section,
        clap_mangen::Man::render_synopsis_section,
        clap_mangen::Man::render_description_section,
        clap_mangen::Man::render_options_section,
    ] {
        let mut section = Vec::new();
        render(&man, &mut section)?;
        out.extend_from_slice(without_preamble(&section));
    }
    let mut commands = Roff::new();
    commands.control("SH", ["COMMANDS"]);
    commands.text([roman(
        "The global options above go before or after the command.",
    )]);
    out.extend_from_slice(without_preamble(&render_roff(&commands)?));
    for sub in cli.get_subcommands() {
        out.extend(command_section(sub)?);
    }
    if let Some(after) = cli.get_after_long_help() {
        out.extend_from_slice(without_preamble(&render_roff(&help_text(
            &after.to_string(),
            Level::Page,
        ))?));
    }
    Ok(ascii_roff(&out))
}

/// The page with every character past ASCII written as roff's escape for
/// it (`→` as `\[u2192]`): groff reads its input as Latin-1, where UTF-8's
/// bytes are other characters or none.
fn ascii_roff(page: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(page);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", u32::from(c)));
        }
    }
    out.into_bytes()
}

/// One subcommand's part of the page: `.SS gem-resources NAME`, its
/// synopsis, what it does, its own options (not the global ones) and the
/// rest of its long help.
fn command_section(sub: &clap::Command) -> std::io::Result<Vec<u8>> {
    let name = format!("{BIN} {}", sub.get_name());
    // Standalone, so the global options are not repeated under each
    // command, and without the `--help` every command has.
    let sub = sub.clone().bin_name(&name).disable_help_flag(true);
    let man = clap_mangen::Man::new(sub.clone());
    let mut out = Vec::new();
    let mut head = Roff::new();
    head.control("SS", [name.as_str()]);
    out.extend_from_slice(without_preamble(&render_roff(&head)?));
    let mut synopsis = Vec::new();
    man.render_synopsis_section(&mut synopsis)?;
    out.extend_from_slice(without_heading(without_preamble(&synopsis)));
    let mut about = Roff::new();
    if let Some(text) = sub.get_long_about().or_else(|| sub.get_about()) {
        about.control("PP", []).text([roman(text.to_string())]);
    }
    out.extend_from_slice(without_preamble(&render_roff(&about)?));
    if sub.get_arguments().any(|a| !a.is_hide_set()) {
        let mut options = Vec::new();
        man.render_options_section(&mut options)?;
        out.extend_from_slice(without_heading(without_preamble(&options)));
    }
    if let Some(after) = sub.get_after_long_help() {
        let text = help_text(&after.to_string(), Level::Command);
        out.extend_from_slice(without_preamble(&render_roff(&text)?));
    }
    Ok(out)
}

/// Where a help text goes: the page's own sections, or inside a command's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// A heading (`Exit status:`) is a section of the page (`.SH EXIT STATUS`).
    Page,
    /// A heading (`Example:`) is a bold line inside the command's section.
    Command,
}

/// A long help written for a terminal, as roff. The help's layout:
/// paragraphs of wrapped lines, separated by blank lines, become filled
/// paragraphs; a `Heading:` line with indented lines under it becomes a
/// list of terms (`  TERM   what it is`, with continuation lines indented
/// further), or lines kept as they are under `Example:` and `First steps:`
/// (commands to copy).
fn help_text(text: &str, level: Level) -> Roff {
    let mut roff = Roff::new();
    for block in text.split("\n\n") {
        let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
        let Some((first, rest)) = lines.split_first() else {
            continue;
        };
        let headed = first.ends_with(':') && !first.starts_with(' ');
        if !headed || rest.is_empty() {
            let joined: Vec<&str> = lines.iter().map(|l| l.trim()).collect();
            roff.control("PP", []).text([roman(joined.join(" "))]);
            continue;
        }
        let heading = first.trim_end_matches(':');
        match level {
            Level::Page => {
                roff.control("SH", [heading.to_uppercase().as_str()]);
            }
            Level::Command => {
                roff.control("PP", []).text([bold(format!("{heading}:"))]);
            }
        }
        if matches!(heading, "Example" | "Examples" | "First steps") {
            roff.control("RS", ["4"]).control("nf", []);
            for line in rest {
                roff.text([roman(line.trim())]);
            }
            roff.control("fi", []).control("RE", []);
        } else {
            for (term, description) in terms(rest) {
                roff.control("TP", [])
                    .text([bold(term)])
                    .text([roman(description)]);
            }
        }
    }
    roff
}

/// The entries of a list of terms: `  TERM   text` starts one (the term
/// ends at the first two spaces), a line indented further continues it.
fn terms(lines: &[&str]) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        match entries.last_mut() {
            Some((_, description)) if indent > 2 => {
                description.push(' ');
                description.push_str(text);
            }
            _ => {
                let (term, description) = text.split_once("  ").unwrap_or((text, ""));
                entries.push((term.to_string(), description.trim().to_string()));
            }
        }
    }
    entries
}

/// `roff` rendered (with its preamble, which [`without_preamble`] drops).
fn render_roff(roff: &Roff) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    roff.to_writer(&mut out)?;
    Ok(out)
}

/// A rendered part without the two lines that define `\*(Aq`, which every
/// rendering starts with and the page needs once (its title has them).
fn without_preamble(rendered: &[u8]) -> &[u8] {
    const PREAMBLE: &[u8] = b".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n";
    rendered.strip_prefix(PREAMBLE).unwrap_or(rendered)
}

/// A rendered section without its `.SH` line, to sit under a command's `.SS`.
fn without_heading(section: &[u8]) -> &[u8] {
    if !section.starts_with(b".SH ") {
        return section;
    }
    match section.iter().position(|&b| b == b'\n') {
        Some(end) => &section[end + 1..],
        None => &[],
    }
}

/// Writes `bytes` to stdout; a closed stdout is not an error.
pub fn print(bytes: &[u8]) {
    let _ = std::io::stdout().lock().write_all(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bash_arm_gets_the_label_the_loop_gives_and_nothing_else_changes() {
        let script = "            gem__resources,install)\n                cmd=\"gem__resources__subcmd__install\"\n                ;;\n        gem__subcmd__resources__subcmd__install)\n            opts=\"--as\"\n";
        let fixed = bash_subcommand_arms(script);
        assert_eq!(
            fixed,
            script.replace(
                "        gem__subcmd__resources__subcmd__install)",
                "        gem__resources__subcmd__install)"
            )
        );
        assert_eq!(bash_subcommand_arms(&fixed), fixed);
    }

    #[test]
    fn help_columns_become_terms_and_examples_keep_their_lines() {
        let text = "Exit status:\n  0    success\n  1    failed (the code is\n       printed)\n\nA paragraph\nwrapped.\n\nExample:\n  gem-resources gc";
        let roff = help_text(text, Level::Page).to_roff();
        assert_eq!(
            roff,
            ".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\nsuccess\n.TP\n\\fB1\\fR\nfailed (the code is printed)\n.PP\nA paragraph wrapped.\n.SH EXAMPLE\n.RS 4\n.nf\ngem\\-resources gc\n.fi\n.RE\n"
        );
    }
}
