// https end to end: a self-signed certificate for 127.0.0.1 made with the OpenSSL API, an
// httplib::SSLServer on loopback, and the client verifying it against that CA (--ca-cert),
// refusing it without (the system CAs do not know it), and skipping the check (--insecure).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "net/net.h"

namespace kvaudit::net {
namespace {

using ::testing::HasSubstr;

// Writes key.pem and cert.pem (CN and SAN IP 127.0.0.1, valid for a day) into dir.
bool make_self_signed(const std::filesystem::path& dir) {
  EVP_PKEY* key = EVP_RSA_gen(2048);
  X509* cert = X509_new();
  if (!key || !cert) return false;
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -60);
  X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ext) return false;
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }
  bool ok = X509_sign(cert, key, EVP_sha256()) > 0;
  FILE* key_file = std::fopen((dir / "key.pem").c_str(), "w");
  FILE* cert_file = std::fopen((dir / "cert.pem").c_str(), "w");
  ok = ok && key_file && cert_file &&
       PEM_write_PrivateKey(key_file, key, nullptr, nullptr, 0, nullptr, nullptr) &&
       PEM_write_X509(cert_file, cert);
  if (key_file) std::fclose(key_file);
  if (cert_file) std::fclose(cert_file);
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

TEST(NetTls, VerifiesAgainstTheGivenCaRefusesUnknownAndSkipsWhenInsecure) {
  auto dir = std::filesystem::temp_directory_path() / ("kvaudit-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(make_self_signed(dir));
  httplib::SSLServer server((dir / "cert.pem").c_str(), (dir / "key.pem").c_str());
  ASSERT_TRUE(server.is_valid());
  server.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"object":"list","data":[{"id":"tls-model"}]})", "application/json");
  });
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread thread([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const Url url = parse_url("https://127.0.0.1:" + std::to_string(port));

  ClientOptions options;
  options.max_retries = 0;
  options.connect_timeout = std::chrono::milliseconds(2000);
  options.read_timeout = std::chrono::milliseconds(2000);
  options.ca_cert_file = (dir / "cert.pem").string();
  {  // clients close their keep-alive connections before the server stops
    Client trusted(url, options);
    EXPECT_EQ(list_models(trusted).at(0).id, "tls-model");

    options.ca_cert_file.clear();
    Client unknown(url, options);
    try {
      list_models(unknown);
      ADD_FAILURE() << "a self-signed certificate was accepted";
    } catch (const RequestError& error) {
      EXPECT_EQ(error.kind(), FailureKind::tls);
      EXPECT_THAT(error.what(), HasSubstr("--insecure"));
    }

    options.verify_tls = false;
    Client insecure(url, options);
    EXPECT_EQ(list_models(insecure).at(0).id, "tls-model");
  }

  server.stop();
  thread.join();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvaudit::net
