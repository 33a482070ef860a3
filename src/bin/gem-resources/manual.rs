//! What the command line says about itself outside a run: the shells'
//! completion scripts (`completions SHELL`).

use std::io::Write;

use clap::CommandFactory;

/// The program's name, as the shells know it.
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
}
