-- Q-ESP dissector for Wireshark / tshark (espgate, docs/QESP.md).
--
-- Install:  cp qesp.lua ~/.local/lib/wireshark/plugins/   (or)
--           tshark -X lua_script:dist/wireshark/qesp.lua -r capture.pcap
-- Another IP protocol number than 253 (gateway.qesp_protocol):
--           tshark -X lua_script:qesp.lua -o qesp.protocol:254 ...
--
-- Shows the clear header (ports, transport protocol, reserved bits, SPI,
-- sequence number) and the length of what follows (IV, ciphertext, ICV).
-- The payload stays opaque: decrypt with `espgate pcap decrypt`.

local qesp = Proto("qesp", "Q-ESP (QoS-friendly ESP)")

local f = qesp.fields
f.sport = ProtoField.uint16("qesp.sport", "Source port", base.DEC)
f.dport = ProtoField.uint16("qesp.dport", "Destination port", base.DEC)
f.port = ProtoField.uint16("qesp.port", "Port", base.DEC)
f.tlp = ProtoField.uint8("qesp.tlp", "Transport protocol", base.DEC)
f.reserved = ProtoField.uint24("qesp.reserved", "Reserved", base.HEX)
f.spi = ProtoField.uint32("qesp.spi", "SPI", base.HEX)
f.seq = ProtoField.uint32("qesp.seq", "Sequence number", base.DEC)
f.payload_len = ProtoField.uint32("qesp.payload_len", "Protected length (IV, ciphertext, ICV)", base.DEC)
f.payload = ProtoField.bytes("qesp.payload", "Protected data")

local e_reserved = ProtoExpert.new("qesp.reserved.nonzero", "Reserved bits are not zero",
    expert.group.PROTOCOL, expert.severity.WARN)
local e_short = ProtoExpert.new("qesp.short", "Shorter than the 16-byte Q-ESP header",
    expert.group.MALFORMED, expert.severity.ERROR)
qesp.experts = { e_reserved, e_short }

qesp.prefs.protocol = Pref.uint("IP protocol number", 253,
    "The IP protocol number Q-ESP travels as (espgate's gateway.qesp_protocol)")

local TLP_NAMES = { [1] = "ICMP", [4] = "IPv4", [6] = "TCP", [17] = "UDP", [33] = "DCCP",
    [41] = "IPv6", [58] = "ICMPv6", [132] = "SCTP", [136] = "UDP-Lite" }

function qesp.dissector(tvb, pinfo, tree)
    local len = tvb:len()
    pinfo.cols.protocol = "Q-ESP"
    local t = tree:add(qesp, tvb(0, math.min(len, 16)))
    if len < 16 then
        t:add_proto_expert_info(e_short)
        return len
    end
    local sport, dport = tvb(0, 2):uint(), tvb(2, 2):uint()
    local tlp = tvb(4, 1):uint()
    t:add(f.sport, tvb(0, 2))
    t:add(f.dport, tvb(2, 2))
    local p1 = t:add(f.port, tvb(0, 2)); p1:set_hidden(true)
    local p2 = t:add(f.port, tvb(2, 2)); p2:set_hidden(true)
    t:add(f.tlp, tvb(4, 1)):append_text(" (" .. (TLP_NAMES[tlp] or "?") .. ")")
    local r = t:add(f.reserved, tvb(5, 3))
    if tvb(5, 3):uint() ~= 0 then
        r:add_proto_expert_info(e_reserved)
    end
    local spi, seq = tvb(8, 4):uint(), tvb(12, 4):uint()
    t:add(f.spi, tvb(8, 4))
    t:add(f.seq, tvb(12, 4))
    t:add(f.payload_len, len - 16)
    if len > 16 then
        tree:add(f.payload, tvb(16))
    end
    t:append_text(string.format(", %s %d -> %d, SPI 0x%08x, seq %d",
        TLP_NAMES[tlp] or tostring(tlp), sport, dport, spi, seq))
    pinfo.cols.info = string.format("Q-ESP %s %d → %d SPI=0x%08x seq=%d len=%d",
        TLP_NAMES[tlp] or tostring(tlp), sport, dport, spi, seq, len - 16)
    return len
end

local registered
local function register()
    local ip_table = DissectorTable.get("ip.proto")
    if registered then
        ip_table:remove(registered, qesp)
    end
    registered = qesp.prefs.protocol
    ip_table:add(registered, qesp)
end

function qesp.prefs_changed()
    register()
end

register()
