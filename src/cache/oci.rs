//! The addresses of the OCI distribution API a cache uses: a blob by its
//! digest (`GET`/`HEAD /v2/<name>/blobs/sha256:<hex>`), the API root
//! (`/v2/`), and a monolithic upload (`POST /v2/<name>/blobs/uploads/`,
//! then `PUT <location>?digest=sha256:<hex>`), as the OCI distribution
//! specification names them.

use url::Url;

/// A registry and the repository a cache keeps its blobs in, from
/// `[cache] oci` (`https://registry.corp.example/gem-resources`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// `https://host[:port]/`.
    base: Url,
    /// The repository name (`gem-resources`, `team/models`).
    repository: String,
}

impl Registry {
    /// Reads `https://host[:port]/<repository>`: https only, no user name
    /// or password in it (they go in `username` and `password_env`), no
    /// query, and a repository name as the specification allows
    /// (lower-case letters and digits, separated by `.`, `_`, `__`, `-`
    /// runs or `/`).
    pub fn parse(text: &str) -> Result<Registry, String> {
        let url = Url::parse(text).map_err(|e| format!("{text:?} is not an address ({e})"))?;
        if url.scheme() != "https" {
            return Err(format!("only https:// is allowed, got {}://", url.scheme()));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(
                "no user name or password in the address: use username and password_env".into(),
            );
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("no query or fragment in the address".into());
        }
        if url.host().is_none() {
            return Err("the address has no host".into());
        }
        let repository = url.path().trim_matches('/').to_string();
        if !valid_repository(&repository) {
            return Err(format!(
                "{repository:?} is not a repository name (the address's path, e.g. https://registry.corp.example/gem-resources; lower-case letters, digits, `.`, `_`, `-` and `/`)"
            ));
        }
        let mut base = url.clone();
        base.set_path("/");
        Ok(Registry { base, repository })
    }

    /// The repository name.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The registry's host as the address rules name it.
    pub fn host(&self) -> String {
        self.base.host_str().unwrap_or_default().to_string()
    }

    /// The port, when the address names one other than 443.
    pub fn port(&self) -> Option<u16> {
        self.base.port()
    }

    /// `https://host[:port]/<repository>`, as configured.
    pub fn address(&self) -> String {
        format!("{}{}", self.base, self.repository)
    }

    /// `/v2/`: answers `200` or `401` on any registry.
    pub fn api_root(&self) -> Url {
        self.join("v2/")
    }

    /// `/v2/<name>/blobs/sha256:<hex>`.
    pub fn blob(&self, sha256: &str) -> Url {
        self.join(&format!("v2/{}/blobs/sha256:{sha256}", self.repository))
    }

    /// `/v2/<name>/blobs/uploads/`: where an upload starts.
    pub fn uploads(&self) -> Url {
        self.join(&format!("v2/{}/blobs/uploads/", self.repository))
    }

    /// `/v2/<name>/blobs/uploads/?mount=sha256:<hex>&from=<other>`: a
    /// cross-repository mount of a blob the registry holds in `from`.
    pub fn mount(&self, sha256: &str, from: &str) -> Url {
        let mut url = self.uploads();
        url.query_pairs_mut()
            .append_pair("mount", &format!("sha256:{sha256}"))
            .append_pair("from", from);
        url
    }

    fn join(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        url.set_path(path);
        url
    }

    /// Whether `url` goes to the registry itself (same scheme, host and
    /// port): the only place its credentials and tokens are sent.
    pub fn same_origin(&self, url: &Url) -> bool {
        url.scheme() == self.base.scheme()
            && url.port_or_known_default() == self.base.port_or_known_default()
            && match (url.host(), self.base.host()) {
                (Some(url::Host::Domain(a)), Some(url::Host::Domain(b))) => {
                    crate::net::guard::normalise_host(a) == crate::net::guard::normalise_host(b)
                }
                (a, b) => a == b,
            }
    }

    /// The `PUT` that finishes an upload: the `Location` the registry gave
    /// (relative or absolute, on the registry itself) with
    /// `digest=sha256:<hex>` added to its query.
    pub fn upload_target(&self, location: &str, sha256: &str) -> Result<Url, String> {
        let mut url = self.base_join(location)?;
        url.query_pairs_mut()
            .append_pair("digest", &format!("sha256:{sha256}"));
        Ok(url)
    }
}

impl Registry {
    /// An upload's `Location` (relative or absolute) as an address, which
    /// must be on the registry itself: its credentials go with it.
    pub fn base_join(&self, location: &str) -> Result<Url, String> {
        let url = self
            .base
            .join(location)
            .map_err(|e| format!("the upload location {location:?} is not an address ({e})"))?;
        if !self.same_origin(&url) {
            return Err(format!(
                "the upload location {} is not on the registry ({})",
                crate::error::shorten_to(url.as_str(), 200),
                self.host()
            ));
        }
        Ok(url)
    }
}

/// A repository name as the distribution specification allows:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`.
pub(crate) fn valid_repository(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|component| {
            let bytes = component.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            !bytes.is_empty()
                && bytes.first().is_some_and(alnum)
                && bytes.last().is_some_and(alnum)
                && bytes
                    .iter()
                    .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
                && !component.contains("..")
                && !component.contains("___")
                && !component.contains(".-")
                && !component.contains("-.")
                && !component.contains("._")
                && !component.contains("_.")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_address_gives_the_api_addresses() {
        let r = Registry::parse("https://Registry.Corp.example:5000/team/gem-resources/").unwrap();
        assert_eq!(r.repository(), "team/gem-resources");
        assert_eq!(
            r.blob(&"a".repeat(64)).as_str(),
            format!(
                "https://registry.corp.example:5000/v2/team/gem-resources/blobs/sha256:{}",
                "a".repeat(64)
            )
        );
        assert_eq!(
            r.uploads().as_str(),
            "https://registry.corp.example:5000/v2/team/gem-resources/blobs/uploads/"
        );
        let put = r
            .upload_target("/v2/team/gem-resources/blobs/uploads/u1?_state=x", "ab")
            .unwrap();
        assert_eq!(
            put.as_str(),
            "https://registry.corp.example:5000/v2/team/gem-resources/blobs/uploads/u1?_state=x&digest=sha256%3Aab"
        );
        assert!(r
            .upload_target("https://elsewhere.example/v2/x", "ab")
            .is_err());
        assert!(r.same_origin(&Url::parse("https://REGISTRY.corp.example:5000/x").unwrap()));
        assert!(!r.same_origin(&Url::parse("https://registry.corp.example/x").unwrap()));
    }

    #[test]
    fn bad_registry_addresses_are_refused() {
        for bad in [
            "http://registry.example/repo",
            "https://user:pw@registry.example/repo",
            "https://registry.example/",
            "https://registry.example/Repo",
            "https://registry.example/repo?x=1",
            "https://registry.example/a..b",
            "not an address",
        ] {
            assert!(Registry::parse(bad).is_err(), "{bad}");
        }
    }
}
