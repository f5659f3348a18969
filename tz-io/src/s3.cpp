#include "tz/io/s3.hpp"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "tz/format/error.hpp"

namespace tz::io {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), {});
  return true;
}

const std::string* lookup(const std::map<std::string, std::map<std::string, std::string>>& ini,
                          const std::string& section, const std::string& key) {
  const auto s = ini.find(section);
  if (s == ini.end()) return nullptr;
  const auto k = s->second.find(key);
  return k == s->second.end() ? nullptr : &k->second;
}

}  // namespace

std::map<std::string, std::map<std::string, std::string>> parse_ini(const std::string& text) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::string section;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(t.substr(1, t.size() - 2));
      out[section];
      continue;
    }
    const auto eq = t.find_first_of("=:");
    if (eq == std::string::npos) continue;
    out[section][trim(t.substr(0, eq))] = trim(t.substr(eq + 1));
  }
  return out;
}

S3Target resolve_s3(const std::string& uri, const S3Options& o, bool for_write,
                    const std::function<const char*(const char*)>& env, const std::string& home) {
  const std::string scheme = "s3://";
  if (uri.compare(0, scheme.size(), scheme) != 0) fail(Errc::invalid_arg, "Not an s3:// URI");
  S3Target t;
  const std::string rest = uri.substr(scheme.size());
  const auto slash = rest.find('/');
  t.bucket = rest.substr(0, slash);
  t.key = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (t.bucket.empty() || t.key.empty()) fail(Errc::invalid_arg, "An S3 URI needs a bucket and a key: s3://bucket/key");
  const auto getenv_str = [&](const char* name) -> std::string {
    const char* v = env(name);
    return v ? std::string(v) : std::string();
  };

  // Credentials and, with them, the s3cmd endpoint.
  std::string endpoint = o.endpoint;
  bool endpoint_trusted = false;  // from env or AWS config: plain http allowed
  std::optional<bool> force_http = o.force_http;
  bool have_creds = o.access_key_id && o.secret_access_key;
  if (have_creds) {
    t.credentials = {*o.access_key_id, *o.secret_access_key, o.session_token.value_or("")};
  } else {
    std::string text;
    const std::string path = o.config_path.empty() ? home + "/.s3cfg" : o.config_path;
    if (read_file(path, text)) {
      const auto ini = parse_ini(text);
      const std::string* ak = lookup(ini, "default", "access_key");
      const std::string* sk = lookup(ini, "default", "secret_key");
      std::string access = o.access_key_id.value_or(ak ? *ak : "");
      std::string secret = o.secret_access_key.value_or(sk ? *sk : "");
      if ((o.access_key_id || ak) && (o.secret_access_key || sk)) {
        have_creds = true;
        t.credentials = {access, secret, o.session_token.value_or("")};
        if (endpoint.empty()) {
          if (const std::string* hb = lookup(ini, "default", "host_base")) endpoint = *hb;
        }
        if (!force_http) {
          if (const std::string* https = lookup(ini, "default", "use_https")) {
            if (*https == "False") force_http = true;
            else if (*https == "True") force_http = false;
          }
        }
      }
    }
  }
  std::map<std::string, std::map<std::string, std::string>> aws_config;
  const std::string profile = getenv_str("AWS_PROFILE").empty() ? "default" : getenv_str("AWS_PROFILE");
  {
    std::string text;
    const std::string path =
        getenv_str("AWS_CONFIG_FILE").empty() ? home + "/.aws/config" : getenv_str("AWS_CONFIG_FILE");
    if (read_file(path, text)) aws_config = parse_ini(text);
  }
  const std::string config_section = profile == "default" ? "default" : "profile " + profile;
  if (!have_creds) {
    const std::string ak = o.access_key_id.value_or(getenv_str("AWS_ACCESS_KEY_ID"));
    const std::string sk = o.secret_access_key.value_or(getenv_str("AWS_SECRET_ACCESS_KEY"));
    if (!ak.empty() && !sk.empty()) {
      have_creds = true;
      t.credentials = {ak, sk, o.session_token.value_or(getenv_str("AWS_SESSION_TOKEN"))};
    }
  }
  if (!have_creds) {
    std::string text;
    const std::string path = getenv_str("AWS_SHARED_CREDENTIALS_FILE").empty()
                                 ? home + "/.aws/credentials"
                                 : getenv_str("AWS_SHARED_CREDENTIALS_FILE");
    for (const auto& [ini, section] :
         {std::make_pair(read_file(path, text) ? parse_ini(text) : decltype(aws_config){}, profile),
          std::make_pair(aws_config, config_section)}) {
      const std::string* ak = lookup(ini, section, "aws_access_key_id");
      const std::string* sk = lookup(ini, section, "aws_secret_access_key");
      if (ak && sk) {
        const std::string* tok = lookup(ini, section, "aws_session_token");
        t.credentials = {*ak, *sk, tok ? *tok : ""};
        have_creds = true;
        break;
      }
    }
  }
  // Otherwise: anonymous (public buckets), requests go unsigned.

  // Endpoint.
  if (endpoint.empty()) {
    for (const char* var : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
      if (!getenv_str(var).empty()) {
        endpoint = getenv_str(var);
        endpoint_trusted = true;
        break;
      }
    }
  }
  if (endpoint.empty()) {
    const std::string* e = lookup(aws_config, config_section, "endpoint_url");
    if (e && !e->empty()) {
      endpoint = *e;
      endpoint_trusted = true;
    }
  }
  if (endpoint.empty()) endpoint = for_write ? "object.ord1.coreweave.com" : "accel-object.ord1.coreweave.com";
  std::string ep_scheme = "https";
  std::string host = endpoint;
  const auto sep = endpoint.find("://");
  if (sep != std::string::npos) {
    ep_scheme = endpoint.substr(0, sep);
    host = endpoint.substr(sep + 3);
    if (ep_scheme == "http" && !force_http.value_or(false) && !endpoint_trusted) {
      fail(Errc::invalid_arg, "Non-HTTPS endpoint URLs are not allowed.");
    }
  }
  if (force_http.value_or(false)) ep_scheme = "http";
  while (!host.empty() && host.back() == '/') host.pop_back();

  // Region.
  t.region = o.region;
  if (t.region.empty()) t.region = getenv_str("AWS_REGION");
  if (t.region.empty()) t.region = getenv_str("AWS_DEFAULT_REGION");
  if (t.region.empty()) {
    const std::string* r = lookup(aws_config, config_section, "region");
    if (r) t.region = *r;
  }
  if (t.region.empty()) t.region = "us-east-1";

  // Addressing: virtual-hosted for CoreWeave's cwobject/cwlota hosts, as upstream; else path-style.
  bool virtual_hosted = host == "cwobject.com" || host == "cwlota.com";
  if (o.addressing == "virtual") virtual_hosted = true;
  else if (o.addressing == "path") virtual_hosted = false;
  else if (!o.addressing.empty()) fail(Errc::invalid_arg, "s3_addressing must be 'path' or 'virtual'");
  const std::string encoded_key = uri_encode(t.key, true);
  if (virtual_hosted) {
    t.host = t.bucket + "." + host;
    t.canonical_uri = "/" + encoded_key;
  } else {
    t.host = host;
    t.canonical_uri = "/" + uri_encode(t.bucket, false) + "/" + encoded_key;
  }
  t.url = ep_scheme + "://" + t.host + t.canonical_uri;
  return t;
}

std::unique_ptr<Source> open_s3_source(const std::string& uri, const S3Options& options, const HttpOptions& http) {
  const char* home = std::getenv("HOME");
  const S3Target target = resolve_s3(
      uri, options, false, [](const char* name) { return std::getenv(name); }, home ? home : "");
  HttpOptions signed_http = http;
  if (!target.credentials.anonymous()) {
    signed_http.sign = [target] {
      SignedRequest r;
      r.method = "GET";
      r.host = target.host;
      r.canonical_uri = target.canonical_uri;
      return sigv4_headers(target.credentials, target.region, r, amz_date_now());
    };
  }
  return std::make_unique<HttpSource>(target.url, signed_http);
}

}  // namespace tz::io
