-- KEYS: rate. ARGV: interval_us. The rate alone, for another attempt inside a held slot (`Slot.pace`).
-- Returns {1, now} when admitted, else {0, wait_us}.
local now = now_us()
local wait = rate_wait(KEYS[1], now)
if wait > 0 then return {0, wait} end
rate_take(KEYS[1], now, tonumber(ARGV[1]))
return {1, now}
