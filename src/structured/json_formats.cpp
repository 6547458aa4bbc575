// Formats follow the RFCs the JSON schema specification cites (RFC 3339 date/time, RFC 3339
// appendix A duration, RFC 5321 email (dot-atom local part), RFC 4122 uuid, RFC 3986 uri,
// RFC 2673/4291 ip addresses, RFC 1123 hostnames). Regular approximations where the RFC is not
// regular are documented in docs/STRUCTURED_OUTPUTS.md.
#include "structured/json_formats.h"

#include <map>

namespace deepinfer::structured {
namespace {

#define DAY_31 "(0[1-9]|[12][0-9]|3[01])"
#define DAY_30 "(0[1-9]|[12][0-9]|30)"
#define DAY_28 "(0[1-9]|1[0-9]|2[0-8])"
#define LEAP_YEAR "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
#define FULL_DATE                                                                             \
  "([0-9]{4}-(0[13578]|1[02])-" DAY_31 "|[0-9]{4}-(0[469]|11)-" DAY_30 "|[0-9]{4}-02-" DAY_28 \
  "|" LEAP_YEAR "-02-29)"
#define TIME_OFFSET "([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define FULL_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?" TIME_OFFSET
#define DEC_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define IPV4 DEC_OCTET "\\." DEC_OCTET "\\." DEC_OCTET "\\." DEC_OCTET
#define H16 "[0-9A-Fa-f]{1,4}"
#define LS32 "(" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                \
  "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32 "|((" H16 \
  ":){0,1}" H16 ")?::(" H16 ":){3}" LS32 "|((" H16 ":){0,2}" H16 ")?::(" H16 ":){2}" LS32   \
  "|((" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|((" H16 ":){0,4}" H16 ")?::" LS32 "|((" H16 \
  ":){0,5}" H16 ")?::" H16 "|((" H16 ":){0,6}" H16 ")?::)"
#define LABEL "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define HOSTNAME LABEL "(\\." LABEL ")*"
#define ATEXT "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
// RFC 3986 section 3 structure.
#define URI_UNRESERVED_SUB "[A-Za-z0-9\\-._~!$&'()*+,;=]"
#define URI_PCT "%[0-9A-Fa-f]{2}"
#define URI_PCHAR "(" URI_UNRESERVED_SUB "|" URI_PCT "|[:@])"
#define URI_HOST                                                                                   \
  "(\\[(" IPV6 "|v[0-9A-Fa-f]+\\.(" URI_UNRESERVED_SUB "|:)+)\\]|(" URI_UNRESERVED_SUB "|" URI_PCT \
  ")*)"
#define URI_AUTHORITY "((" URI_UNRESERVED_SUB "|" URI_PCT "|:)*@)?" URI_HOST "(:[0-9]*)?"
#define URI_HIER                                                                           \
  "(//" URI_AUTHORITY "(/" URI_PCHAR "*)*|/(" URI_PCHAR "+(/" URI_PCHAR "*)*)?|" URI_PCHAR \
  "+(/" URI_PCHAR "*)*|)"

const std::map<std::string, const char*>& formats() {
  static const std::map<std::string, const char*> kFormats = {
      {"date", FULL_DATE},
      {"time", FULL_TIME},
      {"date-time", FULL_DATE "[tT]" FULL_TIME},
      {"duration",
       "P(([0-9]+Y([0-9]+M([0-9]+D)?)?|[0-9]+M([0-9]+D)?|[0-9]+D)(T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-"
       "9]+M([0-9]+S)?|["
       "0-9]+S))?|T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)|[0-9]+W)"},
      {"email", ATEXT "+(\\." ATEXT "+)*@(" HOSTNAME "|\\[" IPV4 "\\]|\\[IPv6:" IPV6 "\\])"},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"uri", "[A-Za-z][A-Za-z0-9+\\-.]*:" URI_HIER "(\\?(" URI_PCHAR "|[/?])*)?(#(" URI_PCHAR
              "|[/?])*)?"},
      {"ipv4", IPV4},
      {"ipv6", IPV6},
      {"hostname", HOSTNAME},
  };
  return kFormats;
}

}  // namespace

const char* format_regex(const std::string& format) {
  auto it = formats().find(format);
  return it == formats().end() ? nullptr : it->second;
}

}  // namespace deepinfer::structured
