// Bearer tokens for keeld (see auth.h).
#include "server/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace keel {
namespace {

constexpr size_t kMinTokenLength = 16;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Status ReadTokenFile(const std::string& path, std::vector<std::string>* out) {
  std::ifstream in(path);
  if (!in) return Status::Error("token file '" + path + "': cannot read it");
  for (std::string line; std::getline(in, line);) {
    size_t hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    line = Trim(line);
    if (!line.empty()) out->push_back(line);
  }
  return Status::Ok();
}

std::string RandomToken() {
  std::random_device device;  // /dev/urandom
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 32; ++i) {
    unsigned int byte = device() & 0xFFu;
    token += kHex[byte >> 4];
    token += kHex[byte & 15];
  }
  return token;
}

// The token stored in <dir>/<name>, created on first use.
Status GeneratedToken(const std::string& dir, const std::string& name, std::string* token) {
  const std::string path = dir + "/" + name;
  std::vector<std::string> tokens;
  if (access(path.c_str(), F_OK) == 0) {
    KEEL_RETURN_IF_ERROR(ReadTokenFile(path, &tokens));
    if (tokens.size() != 1) return Status::Error("token file '" + path + "': expected one token");
    *token = tokens[0];
    return Status::Ok();
  }
  *token = RandomToken();
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Status::Error("token file '" + path + "': cannot create it");
  std::string line = *token + "\n";
  bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && fsync(fd) == 0;
  close(fd);
  if (!ok) return Status::Error("token file '" + path + "': cannot write it");
  return Status::Ok();
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status CheckLength(const std::string& what, const std::string& token) {
  if (token.size() >= kMinTokenLength) return Status::Ok();
  return Status::Error(what + ": a token of " + std::to_string(token.size()) +
                       " characters is too short (at least " + std::to_string(kMinTokenLength) + ")");
}

}  // namespace

Status LoadAuthConfig(const std::string& user_tokens_file, const std::string& worker_token_file,
                      const std::string& state_dir, AuthConfig* out) {
  AuthConfig auth;
  if (!user_tokens_file.empty()) KEEL_RETURN_IF_ERROR(ReadTokenFile(user_tokens_file, &auth.user_tokens));
  if (const char* env = std::getenv("KEEL_USER_TOKENS")) {
    std::stringstream parts(env);
    for (std::string t; std::getline(parts, t, ',');) {
      if (!Trim(t).empty()) auth.user_tokens.push_back(Trim(t));
    }
  }
  if (!worker_token_file.empty()) {
    std::vector<std::string> tokens;
    KEEL_RETURN_IF_ERROR(ReadTokenFile(worker_token_file, &tokens));
    if (tokens.size() != 1) {
      return Status::Error("--worker-token-file '" + worker_token_file + "': expected one token, found " +
                           std::to_string(tokens.size()));
    }
    auth.worker_token = tokens[0];
  } else if (const char* env = std::getenv("KEEL_WORKER_TOKEN")) {
    auth.worker_token = Trim(env);
  }
  if (auth.user_tokens.empty() && !state_dir.empty()) {
    std::string token;
    KEEL_RETURN_IF_ERROR(GeneratedToken(state_dir, "user.token", &token));
    auth.user_tokens.push_back(token);
  }
  if (auth.worker_token.empty() && !state_dir.empty()) {
    KEEL_RETURN_IF_ERROR(GeneratedToken(state_dir, "worker.token", &auth.worker_token));
  }
  if (auth.user_tokens.empty()) return Status::Error("user tokens: none given (--user-tokens-file or KEEL_USER_TOKENS)");
  if (auth.worker_token.empty()) return Status::Error("worker token: none given (--worker-token-file or KEEL_WORKER_TOKEN)");
  for (const std::string& t : auth.user_tokens) KEEL_RETURN_IF_ERROR(CheckLength("user token", t));
  KEEL_RETURN_IF_ERROR(CheckLength("worker token", auth.worker_token));
  for (const std::string& t : auth.user_tokens) {
    if (t == auth.worker_token) return Status::Error("worker token: must differ from every user token");
  }
  *out = auth;
  return Status::Ok();
}

grpc::Status Authorize(const grpc::ServerContext& context, const AuthConfig& auth, Caller needed) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization metadata (Bearer token)");
  }
  const std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  if (value.compare(0, prefix.size(), prefix) != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: expected 'Bearer <token>'");
  }
  const std::string token = value.substr(prefix.size());
  bool ok = false;
  if (needed == Caller::kWorker) {
    ok = ConstantTimeEquals(token, auth.worker_token);
  } else {
    for (const std::string& t : auth.user_tokens) ok |= ConstantTimeEquals(token, t);
  }
  if (!ok) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        needed == Caller::kWorker ? "invalid worker token" : "invalid user token");
  }
  return grpc::Status::OK;
}

std::string BearerValue(const std::string& token) { return "Bearer " + token; }

}  // namespace keel
